//! `meshd channel delete` and `meshd service delete`: one request each, and a line saying what went and how many messages with it.

use std::path::Path;

use meshd::protocol::{REPLIES_SUFFIX, Request};

use super::wire::call;
use crate::exit::Exit;

/// `meshd channel delete NAME [--discard]`.
pub(super) fn channel(socket: &Path, name: &str, discard: bool) -> Result<(), Exit> {
    let resp = call(socket, &Request::ChannelDelete { name: name.to_string(), discard }, &[])?;
    println!("deleted channel {name} ({})", discarded(resp.discarded.unwrap_or(0)));
    Ok(())
}

/// `meshd service delete NAME [--discard]`.
pub(super) fn service(socket: &Path, name: &str, discard: bool) -> Result<(), Exit> {
    let resp = call(socket, &Request::ServiceDelete { name: name.to_string(), discard }, &[])?;
    println!(
        "deleted service {name}: fan-in channel {name} and group {name}{REPLIES_SUFFIX} ({})",
        discarded(resp.discarded.unwrap_or(0))
    );
    Ok(())
}

/// How many messages went with the channels, in words.
fn discarded(n: u64) -> String {
    match n {
        0 => "no message discarded".to_string(),
        1 => "1 message discarded".to_string(),
        n => format!("{n} messages discarded"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_count_of_discarded_messages_reads_as_words() {
        assert_eq!(super::discarded(0), "no message discarded");
        assert_eq!(super::discarded(1), "1 message discarded");
        assert_eq!(super::discarded(7), "7 messages discarded");
    }
}
