//! The `tributary` command: flag definitions and glue over the library crates.
//!
//! Errors print once, as `tributary: <error>: <cause>…`, and exit with status 1 (usage errors
//! exit with 2, from the argument parser). A closed standard output (`tributary receive … |
//! head`) ends the command quietly with status 0.

// A binary's modules are private to it; `pub` marks each module's interface to the others.
#![allow(unreachable_pub)]

mod admin;
mod args;
mod bench;
mod bench_capture;
#[cfg(feature = "kafka-bench")]
mod bench_kafka;
mod bench_processor;
mod bench_replicate;
mod bench_scale;
mod bench_silent;
mod commands;
mod demo;
mod doors;
mod emulator;
mod failover;
mod failover_translate;
mod generate;
mod hub_handle;
mod input;
mod kafka;
mod migrate;
mod output;
mod policy;
mod process;
mod receipts;
mod receive;
mod replicate;
mod running;
mod serve;
mod throughput;

use std::process::ExitCode;

use crate::args::{Cli, Command, GlobalArgs};

/// mimalloc instead of the system allocator: the AMQP engine allocates several small buffers
/// per event delivered, and with mimalloc delivery costs about a fifth less CPU per event
/// (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = args::parse();
    let global = cli.global();
    init_tracing(&global.log);
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
    let outcome = runtime.block_on(run(&cli, &global));
    // Do not wait for tasks still blocked (e.g. followers waiting for events).
    runtime.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => report(&err),
    }
}

async fn run(cli: &Cli, global: &GlobalArgs) -> anyhow::Result<()> {
    match &cli.command {
        Command::Serve(args) => serve::serve(global, args).await,
        Command::Hub(args) => commands::hub(global, args).await,
        Command::Group(args) => commands::group(global, args).await,
        Command::Policy(args) => policy::run(global, args).await,
        Command::Send(args) => commands::send(global, args).await,
        Command::Receive(args) => receive::receive(global, args).await,
        Command::Process(args) => process::process(global, args).await,
        Command::Ownership(args) => process::ownership(global, args).await,
        Command::Migrate(_) => migrate::run(global).await,
        Command::Replicate(args) => replicate::run(args).await,
        Command::Cert(args) => serve::cert(global, args),
        Command::ConnectionString(args) => commands::connection_string(global, args),
        Command::Bench(args) => bench::run(global, args).await,
        Command::Failover(args) => failover::run(global, args).await,
        Command::Demo(args) => demo::run(global, args).await,
        Command::Completions(args) => generate::completions(args),
        Command::Man(args) => generate::man(args),
        Command::DemoWorker(args) => demo::aggregate::worker(global, args).await,
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
    eprintln!("tributary: {}", error_text(err));
    ExitCode::from(1)
}

/// The error and its causes, `: `-separated, each said once: a cause whose text its parent
/// already includes (errors that print their source, e.g. `thiserror`'s `{source}`) is skipped.
fn error_text(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files or pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("invalid partition id \"99\"")
        }
    }
    impl std::error::Error for Inner {}

    #[derive(Debug)]
    struct Outer(Inner);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "event hub \"h\": {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_its_parent_already_prints_is_said_once() {
        let err = anyhow::Error::new(Outer(Inner)).context("cannot send");
        assert_eq!(
            error_text(&err),
            "cannot send: event hub \"h\": invalid partition id \"99\""
        );
    }
}
