//! `rdmalog dump` and `rdmalog check`: a stopped node's data dir, read-only, through
//! `wal::inspect`.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use wal::fs::StdFs;
use wal::inspect::{self, CheckReport};

fn inspect_dir(dir: &Path) -> anyhow::Result<CheckReport> {
    inspect::check(&StdFs, dir).with_context(|| format!("cannot check {}", dir.display()))
}

/// Prints the summary; exit 1 on corruption, 0 otherwise (a torn tail is a warning).
pub(crate) fn check(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let report = inspect_dir(dir)?;
    out.write_all(inspect::summary(&report).as_bytes())?;
    out.flush()?;
    if let Some(c) = &report.corruption {
        eprintln!("rdmalog: {}: corrupt: {c}", dir.display());
        return Ok(ExitCode::from(1));
    }
    if let Some(t) = &report.torn_tail {
        eprintln!(
            "rdmalog: warning: {}: torn tail: {t} (recovery cuts it at the next open)",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the summary, then `index term lsn len crc32c` (and the payload in hex) per entry.
pub(crate) fn dump(dir: &Path, payload: bool, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let report = inspect_dir(dir)?;
    out.write_all(inspect::summary(&report).as_bytes())?;
    writeln!(
        out,
        "{:>12} {:>8} {:>16} {:>8} {:>10}{}",
        "index",
        "term",
        "lsn",
        "len",
        "crc32c",
        if payload { "  payload" } else { "" }
    )?;
    let mut failed: Option<io::Error> = None;
    inspect::dump(&StdFs, dir, |index, term, lsn, data| {
        if failed.is_some() {
            return;
        }
        // Only valid records reach here, so this recomputes exactly the stored checksum.
        let header = wal::format::entry_header(lsn, index, term, data);
        let crc = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let r = write!(
            out,
            "{:>12} {:>8} {:>16} {:>8} 0x{crc:08x}",
            index.0,
            term.0,
            lsn.0,
            data.len()
        )
        .and_then(|()| {
            if payload {
                write!(out, "  {}", crate::hex(data))
            } else {
                Ok(())
            }
        })
        .and_then(|()| writeln!(out));
        if let Err(e) = r {
            failed = Some(e);
        }
    })
    .with_context(|| format!("cannot dump {}", dir.display()))?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(ExitCode::SUCCESS)
}
