//! The first failure a thread of the test reports.

use std::sync::Mutex;

/// The first failure a thread of the test reports (later ones are dropped: the first is the cause).
#[derive(Debug, Default)]
pub struct FirstFailure(Mutex<Option<String>>);

impl FirstFailure {
    /// Keeps `why` unless a failure is kept already.
    pub fn set(&self, why: String) {
        let mut f = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// The failure kept, if any.
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
