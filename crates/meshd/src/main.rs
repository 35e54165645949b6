//! meshd's command line: `meshd run` starts the daemon; every other subcommand is a client of its control socket.
//!
//! Exit codes a script can rely on: 0 done; 1 refused (meshd's reason on stderr); 2 bad usage;
//! 3 meshd not reachable; 4 a send or receive timed out.

mod cli;
mod client;
mod daemon;
mod exit;

use std::process::ExitCode;

use meshd::start;

use cli::{Cli, Command};
use exit::{Exit, refused};

fn main() -> ExitCode {
    meshd::replace::mark_process_start();
    meshd::handoff::mark_started_from();
    let cli = parse_cli();
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
/// The command line, where a flag beats any environment variable: `--device N` given on the command
/// line outranks a MESHD_SOCKET from the environment (which would otherwise win, as --socket does, and
/// send `meshd --device 1 ps` to whichever meshd that socket belongs to). The order: --socket, then
/// --device, then MESHD_SOCKET, then MESHD_DEVICE.
fn parse_cli() -> Cli {
    use clap::parser::ValueSource;
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let from_env = |id: &str| matches!(global_source(&matches, id), Some(ValueSource::EnvVariable));
    let from_flag = |id: &str| matches!(global_source(&matches, id), Some(ValueSource::CommandLine));
    if from_env("socket") && from_flag("device") {
        cli.socket = None;
    }
    cli
}

/// Where a global argument's value came from, looked up in the subcommand's matches too (a global
/// given after the subcommand is recorded there).
fn global_source(matches: &clap::ArgMatches, id: &str) -> Option<clap::parser::ValueSource> {
    let mut m = matches;
    let mut source = m.value_source(id);
    while let Some((_, sub)) = m.subcommand() {
        if let Some(s) = sub.value_source(id) {
            source = Some(s);
        }
        m = sub;
    }
    source
}

fn dispatch(cli: Cli) -> Result<(), Exit> {
    if let Command::Run(args) = cli.command {
        return daemon::run(args, cli.socket, cli.device).map_err(refused);
    }
    let socket = client::socket(cli.socket, cli.device.as_deref())?;
    client::dispatch(&socket, cli.command)
}
