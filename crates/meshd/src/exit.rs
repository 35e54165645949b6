//! A failed command and the exit code it maps to (what `main` returns and every subcommand reports through).

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Exit(pub u8, pub anyhow::Error);

/// A refusal: exit code 1, meshd's (or the request's) reason on stderr.
pub fn refused(e: impl Into<anyhow::Error>) -> Exit {
    Exit(1, e.into())
}
