//! A service client's window: at most its reply ring's capacity of requests unanswered, so that its replies never find the ring full.
//!
//! A program answering requests in order (every loop in mesh.cuh) that finds a client's reply ring
//! full waits at that reply and serves *no other client* until that client reads. A client that
//! keeps at most the ring's capacity of requests unanswered never fills it, so one careless client
//! cannot stall the service for everyone. Every client API (Rust's `meshd::ServiceClient`, C's
//! `mesh_service_*`, Python's `meshd.Service`) keeps this count; a full window is the caller's to
//! open, by receiving replies, so a blocking send must not wait on it.

/// Requests sent and replies received by one client, and how many may be unanswered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyWindow {
    sent: u64,
    received: u64,
    /// `None`: no limit (a program that does not answer each request exactly once).
    limit: Option<u32>,
    /// The reply ring's capacity: the widest window.
    capacity: u32,
}

impl ReplyWindow {
    /// The window of a client whose reply ring holds `reply_capacity` replies: that many.
    pub fn new(reply_capacity: u32) -> Self {
        Self { sent: 0, received: 0, limit: Some(reply_capacity.max(1)), capacity: reply_capacity.max(1) }
    }

    /// Requests sent whose replies have not been received.
    pub fn unanswered(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    /// How many may be unanswered at once (`None`: no limit).
    pub fn limit(&self) -> Option<u32> {
        self.limit
    }

    /// Sets the limit: `Some(n)` for n from 1 to the reply ring's capacity, or `None`; anything
    /// else is refused with the rule, the limit unchanged.
    pub fn set_limit(&mut self, limit: Option<u32>) -> Result<(), String> {
        if let Some(n) = limit
            && !(1..=self.capacity).contains(&n)
        {
            return Err(format!(
                "a window of {n} requests: it must be 1 to the reply ring's capacity, {} (or none)",
                self.capacity
            ));
        }
        self.limit = limit;
        Ok(())
    }

    /// Whether one more request may be sent.
    pub fn is_open(&self) -> bool {
        self.limit.is_none_or(|n| self.unanswered() < u64::from(n))
    }

    /// Why a send was refused, for an error naming the service.
    pub fn full(&self, service: &str) -> String {
        format!(
            "service {service:?}: {} requests unanswered, the client's window ({} replies, what its reply ring holds): \
             receive replies before sending more",
            self.unanswered(),
            self.limit.unwrap_or(self.capacity)
        )
    }

    /// Counts a request sent.
    pub fn sent(&mut self) {
        self.sent += 1;
    }

    /// Counts a reply received. Never more than were sent: a reply the program repeated (after a
    /// crash of the program, its re-taken requests are answered again) must not open the window
    /// past the ring; a repeat that arrives while requests are unanswered still counts as one of
    /// their answers, which no count without the replies' sequence numbers can tell apart.
    pub fn received(&mut self) {
        self.received = (self.received + 1).min(self.sent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_closes_at_its_limit_and_opens_by_one_per_reply() {
        let mut w = ReplyWindow::new(4);
        assert_eq!((w.limit(), w.unanswered(), w.is_open()), (Some(4), 0, true));
        for _ in 0..4 {
            assert!(w.is_open());
            w.sent();
        }
        assert!(!w.is_open());
        assert!(w.full("kv").contains("4 requests unanswered"), "{}", w.full("kv"));
        w.received();
        assert_eq!((w.unanswered(), w.is_open()), (3, true));
        assert!(w.set_limit(Some(5)).is_err() && w.set_limit(Some(0)).is_err());
        assert_eq!(w.limit(), Some(4), "a refused limit leaves it as it was");
        w.set_limit(Some(3)).unwrap();
        assert!(!w.is_open(), "narrowed below what is unanswered");
        w.set_limit(None).unwrap();
        for _ in 0..100 {
            w.sent();
        }
        assert!(w.is_open());
        // More replies than requests (a program that answers twice): never below zero, and the
        // surplus opens nothing later.
        for _ in 0..200 {
            w.received();
        }
        assert_eq!(w.unanswered(), 0);
        w.set_limit(Some(4)).unwrap();
        for _ in 0..4 {
            w.sent();
        }
        assert!(!w.is_open(), "repeats received earlier do not widen the window");
    }
}
