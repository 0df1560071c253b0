//! The `tributary` command: flag definitions and glue over the library crates.
//!
//! Errors print once, as `tributary: <error>: <cause>…`, and exit with status 1 (usage errors
//! exit with 2, from the argument parser). A closed standard output (`tributary receive … |
//! head`) ends the command quietly with status 0.

// A binary's modules are private to it; `pub` marks each module's interface to the others.
#![allow(unreachable_pub)]

mod args;
mod bench;
mod bench_processor;
mod bench_replicate;
mod bench_silent;
mod commands;
mod hub_handle;
mod input;
mod output;
mod process;
mod replicate;
mod serve;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

/// mimalloc instead of the system allocator: the AMQP engine allocates several small buffers
/// per event delivered, and with mimalloc delivery costs about a fifth less CPU per event
/// (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.global.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tributary: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(run(cli));
    // Do not wait for tasks still blocked (e.g. followers waiting for events).
    runtime.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => report(&err),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match &cli.command {
        Command::Serve(args) => serve::serve(global, args).await,
        Command::Hub(command) => commands::hub(global, command).await,
        Command::Group(command) => commands::group(global, command).await,
        Command::Send(args) => commands::send(global, args).await,
        Command::Receive(args) => commands::receive(global, args).await,
        Command::Process(args) => process::process(global, args).await,
        Command::Ownership(args) => process::ownership(global, args).await,
        Command::Replicate(args) => replicate::run(args).await,
        Command::Cert(args) => serve::cert(global, args),
        Command::ConnectionString(args) => commands::connection_string(global, args),
        Command::Bench(args) => bench::run(global, args).await,
    }
}

fn report(err: &anyhow::Error) -> ExitCode {
    for cause in err.chain() {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::BrokenPipe
        {
            return ExitCode::SUCCESS;
        }
    }
    eprintln!("tributary: {err:#}");
    ExitCode::from(1)
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
