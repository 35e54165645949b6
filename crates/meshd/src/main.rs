//! meshd's command line: `meshd run` starts the daemon; every other subcommand is a client of its control socket.
//!
//! Exit codes a script can rely on: 0 done; 1 refused (meshd's reason on stderr); 2 bad usage;
//! 3 meshd not reachable; 4 a send or receive timed out.

mod cli;
mod client;
mod daemon;

use std::process::ExitCode;

use clap::Parser;
use meshd::start;

use cli::{Cli, Command};

/// A failure with the exit code it maps to.
#[derive(Debug)]
struct Exit(u8, anyhow::Error);

fn refused(e: impl Into<anyhow::Error>) -> Exit {
    Exit(1, e.into())
}

fn main() -> ExitCode {
    meshd::replace::mark_process_start();
    let cli = Cli::parse();
    // SAFETY: nothing but this thread runs yet (clap spawns none), and the driver is not loaded.
    unsafe { start::select_device_env(cli.device.as_deref()) };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MESHD_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit(code, e)) => {
            eprintln!("meshd: {e:#}");
            ExitCode::from(code)
        }
    }
}
fn dispatch(cli: Cli) -> Result<(), Exit> {
    if let Command::Run(args) = cli.command {
        return daemon::run(args, cli.socket, cli.device).map_err(refused);
    }
    let socket = client::socket(cli.socket, cli.device.as_deref())?;
    client::dispatch(&socket, cli.command)
}
