//! The churn's events against a running meshd: channels and services created, left holding
//! messages, and deleted under traffic, each answer checked against what the churn holds.

use mesh_shm::{Mailbox, Producer};
use meshd::ServiceClient;

use super::churn::{Churn, Expect, MAX_CHURN_SERVICES, discarded_in};
use super::schedule::Rng;
use super::unit::UnitMeshd;

/// Stream channels (bound by a stream program, some also held by a host end of this process): a
/// delete of one must be refused, naming who holds it.
const HELD: [&str; 7] = ["h2g", "g2h", "to-echo", "from-echo", "g2g", "pp-a", "pp-b"];

impl Churn {
    /// Creates a churn channel (in device memory now and then where `device`), and half the time
    /// leaves messages on one; `None` when as many live as the churn allows.
    pub fn create_channel(&mut self, d: &UnitMeshd, mb: &Mailbox, rng: &mut Rng, device: bool) -> Option<()> {
        let (name, c) = self.new_channel(rng, device)?;
        let args = c.create_args(&name);
        d.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        self.made(name, c);
        if rng.below(2) == 0 {
            self.queue(mb, rng);
        }
        Some(())
    }

    /// Leaves messages on a churn channel in the mailbox, which nobody consumes: they stay through
    /// every crash, and its delete must count them, or be refused without `--discard`.
    fn queue(&mut self, mb: &Mailbox, rng: &mut Rng) {
        let Some((name, room)) = self.to_queue(rng) else { return };
        let msg = vec![0x5a; self.channels[&name].msg_size as usize];
        let want = 1 + rng.below(room);
        let mut tx = Producer::claim(mb, &name).unwrap_or_else(|e| panic!("the producer end of {name}: {e}"));
        let mut sent = 0;
        while sent < want && tx.try_send(&msg).unwrap_or_else(|e| panic!("a send on {name}: {e}")) {
            sent += 1;
        }
        self.queued(&name, sent);
    }

    /// Deletes a churn channel (refused while it holds messages and the delete does not discard
    /// them), or one time in four a stream's channel: refused, naming the program's slot or the host
    /// end's pid that holds it, and the stream goes on (the test's recovery check sees every stream
    /// move on after every event). `None` when there is nothing to delete.
    pub fn delete_channel(&mut self, d: &UnitMeshd, rng: &mut Rng) -> Option<()> {
        if rng.below(4) == 0 {
            let name = *rng.pick(&HELD)?;
            let out = d.cli(&["channel", "delete", name, "--discard"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && (err.contains("slot") || err.contains("pid")),
                "deleting stream channel {name} is refused, naming who holds it: {err}"
            );
            return Some(());
        }
        let (name, discard) = self.to_delete(rng)?;
        let mut args = vec!["channel", "delete", name.as_str()];
        if discard {
            args.push("--discard");
        }
        let out = d.cli(&args);
        let (said, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        match self.expect_delete(&name, discard) {
            Expect::Deleted(n) => {
                assert!(out.status.success(), "meshd {args:?}: {err}\n{}", d.log_tail(40));
                assert_eq!(discarded_in(&said), Some(n), "meshd {args:?} said: {said}");
                self.deleted(&name);
            }
            Expect::Queued(n) => assert!(
                !out.status.success() && err.contains(&n.to_string()),
                "meshd {args:?} with {n} messages queued must be refused, counting them: {said}{err}"
            ),
        }
        Some(())
    }

    /// Creates a churn service (two clients, 64-byte requests); `None` when as many live as the
    /// churn allows.
    pub fn create_service(&mut self, d: &UnitMeshd) -> Option<()> {
        if self.services.len() >= MAX_CHURN_SERVICES {
            return None;
        }
        let name = self.fresh("svc");
        d.ok(&["service", "create", &name, "--clients", "2", "--msg-size", "64", "--capacity", "16"]);
        self.services.insert(name);
        Some(())
    }

    /// Deletes a churn service: refused, naming the client, while this process is attached to it;
    /// deleted once it detached. `None` when there is none.
    pub fn delete_service(&mut self, d: &UnitMeshd, rng: &mut Rng) -> Option<()> {
        let names: Vec<String> = self.services.iter().cloned().collect();
        let name = rng.pick(&names)?.clone();
        let client =
            ServiceClient::connect(d.socket(), &name).unwrap_or_else(|e| panic!("attaching to service {name}: {e:#}"));
        let out = d.cli(&["service", "delete", &name, "--discard"]);
        let err = String::from_utf8_lossy(&out.stderr);
        let ours = format!("pid {}", std::process::id());
        assert!(
            !out.status.success() && (err.contains(&ours) || err.contains("client")),
            "deleting service {name} with a client attached is refused, naming it: {err}"
        );
        client.detach().unwrap_or_else(|e| panic!("detaching from service {name}: {e:#}"));
        let said = d.ok(&["service", "delete", &name]);
        assert_eq!(discarded_in(&said), Some(0), "service {name} held nothing: {said}");
        self.services.remove(&name);
        Some(())
    }

    /// Deletes every churn channel and service (the run's end), each counting what it discarded.
    pub fn delete_all(&mut self, d: &UnitMeshd) {
        for name in std::mem::take(&mut self.services) {
            d.ok(&["service", "delete", &name, "--discard"]);
        }
        for (name, c) in std::mem::take(&mut self.channels) {
            let said = d.ok(&["channel", "delete", &name, "--discard"]);
            assert_eq!(discarded_in(&said), Some(c.queued), "channel {name}: {said}");
        }
    }
}
