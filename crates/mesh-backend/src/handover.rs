//! What a backend leaves for the new image of meshd that replaces its process (`meshd handoff`).

/// How the programs wait for the new image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handover {
    /// Every program was stopped in order; the new image relaunches them from the state directory.
    Stopped,
    /// The programs run on, each in a process of its own that waits for the new image to adopt it.
    RunningOn {
        /// The programs left running.
        programs: usize,
        /// Programs whose process was not seen waiting in time, each with why: the new image stops
        /// and relaunches them (their names, for the reply).
        late: Vec<String>,
    },
}
