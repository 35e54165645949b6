//! Native GPU workers ([`crate::native`]) as the control plane serves them: `spawn` on the
//! backend thread, `stop` on the connection thread.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::shared::Shared;
use crate::native::NativeSpec;
use crate::protocol::Response;

/// `spawn`, on the backend thread (the worker's PDEATHSIG watches it); answered from the worker's
/// own waiting thread once it is ready or refused, so the backend thread goes on meanwhile.
pub(super) fn native_spawn(shared: &Shared, spec: NativeSpec, reply: mpsc::SyncSender<Response>) {
    if shared.stopping.load(Ordering::Acquire) {
        let _ = reply.send(Response::error("meshd is shutting down"));
        return;
    }
    shared.natives.spawn(spec, move |outcome| {
        let _ = reply.send(match outcome {
            Ok(row) => Response { ok: true, natives: Some(vec![row]), ..Response::default() },
            Err(why) => Response::error(why),
        });
    });
}

/// `stop`, on the connection thread (it waits out the grace period; nothing else waits on it).
pub(super) fn native_stop(shared: &Shared, name: &str) -> Response {
    match shared.natives.stop(name) {
        Ok(row) => Response { ok: true, natives: Some(vec![row]), ..Response::default() },
        Err(why) => Response::error(why),
    }
}
