//! `tributary completions` and `tributary man`: shell completion scripts and man pages generated
//! from the command definitions ([`crate::args::command`]), so they name exactly the commands
//! and flags `--help` shows, hidden ones left out. Nothing here is written by hand.

use std::io::Write;

use anyhow::{Context, Result};

use crate::args::{CompletionsArgs, ManArgs};

/// The name the scripts complete and the pages document.
const BIN_NAME: &str = "tributary";

/// `tributary completions SHELL`: the script on standard output.
pub fn completions(args: &CompletionsArgs) -> Result<()> {
    let mut command = crate::args::command();
    // Generated whole first: the generators panic on a failed write (`… | head`).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, BIN_NAME, &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(())
}

/// `tributary man`: the main page on standard output, or every page into `--dir`.
pub fn man(args: &ManArgs) -> Result<()> {
    // `help` is `--help` again; it gets no page of its own.
    let command = crate::args::command().disable_help_subcommand(true);
    match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(command, dir))
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            eprintln!(
                "wrote {BIN_NAME}.1 and a page per command into {} (read one with man -l)",
                dir.display()
            );
            Ok(())
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command).render(&mut page)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&page)?;
            out.flush()?;
            Ok(())
        }
    }
}
