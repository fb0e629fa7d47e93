//! Showing the library's progress board (`wanbake::progress`) while a command works: one
//! indicatif bar per running phase on a terminal (hashing inputs and writing overlap, so
//! both are shown), plain lines elsewhere (when a phase has run for a second, then every
//! 10 % or 10 s, and when it ends), nothing with `--quiet` or `--json`. A phase shorter than
//! a second is never shown.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wanbake::progress::{self, Phase, Snapshot};

/// How progress is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Show {
    Bars,
    Lines,
}

/// Runs `work` while a watcher thread shows every phase on the board (when `human`: not
/// `--quiet`, not `--json`).
pub fn watching<T>(human: bool, work: impl FnOnce() -> T) -> T {
    let show = if !human {
        return work();
    } else if std::io::stderr().is_terminal() {
        Show::Bars
    } else {
        Show::Lines
    };
    // Dropping the sender wakes the watcher at once (a sleeping watcher would add its
    // polling interval to every command).
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || watch(show, finished));
        let out = work();
        drop(done);
        out
    })
}

/// What the watcher shows of one phase.
struct Shown {
    phase: Arc<Phase>,
    bar: Option<indicatif::ProgressBar>,
    last_line: (u64, Instant),
}

fn watch(show: Show, finished: std::sync::mpsc::Receiver<()>) {
    let multi = indicatif::MultiProgress::new();
    let mut shown: BTreeMap<u64, Shown> = BTreeMap::new();
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
        finished.recv_timeout(Duration::from_millis(100))
    {
        let board = progress::board();
        // Phases that ended.
        let live: Vec<u64> = board.iter().map(|p| p.id).collect();
        let ended: Vec<u64> = shown
            .keys()
            .filter(|id| !live.contains(id))
            .copied()
            .collect();
        for id in ended {
            if let Some(s) = shown.remove(&id) {
                finish(s, show);
            }
        }
        for phase in board {
            if phase.started.elapsed() < Duration::from_secs(1) {
                continue;
            }
            let s = shown.entry(phase.id).or_insert_with(|| Shown {
                bar: (show == Show::Bars).then(|| multi.add(new_bar(&phase))),
                last_line: (u64::MAX, Instant::now()),
                phase: phase.clone(),
            });
            update(s);
        }
    }
    for (_, s) in shown {
        finish(s, show);
    }
}

fn new_bar(phase: &Phase) -> indicatif::ProgressBar {
    let snap = phase.progress.snapshot();
    let (len, template) = if snap.total_bytes > 0 {
        (
            snap.total_bytes,
            "{prefix:>15} {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
    } else {
        (
            snap.total_items,
            "{prefix:>15} {bar:40} {pos}/{len} {elapsed}",
        )
    };
    let b = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    b.set_style(style);
    b.set_prefix(phase.name.clone());
    b
}

fn update(s: &mut Shown) {
    let snap = s.phase.progress.snapshot();
    if let Some(b) = &s.bar {
        if snap.total_bytes == 0 {
            b.set_position(snap.items);
            return;
        }
        b.set_position(snap.bytes);
        if snap.total_items > 0 {
            b.set_message(format!("{}/{}", snap.items, snap.total_items));
        }
        return;
    }
    let tenth = snap
        .bytes
        .saturating_mul(10)
        .checked_div(snap.total_bytes)
        .unwrap_or_else(|| snap.items.saturating_mul(10) / snap.total_items.max(1));
    if s.last_line.0 == u64::MAX
        || tenth > s.last_line.0
        || s.last_line.1.elapsed() >= Duration::from_secs(10)
    {
        eprintln!("{}", line(&s.phase.name, &snap, s.phase.started.elapsed()));
        s.last_line = (tenth, Instant::now());
    }
}

fn finish(s: Shown, show: Show) {
    match (&s.bar, show) {
        (Some(b), _) => b.finish_and_clear(),
        (None, Show::Lines) => eprintln!(
            "{}: done in {:.1} s",
            s.phase.name,
            s.phase.started.elapsed().as_secs_f64()
        ),
        (None, Show::Bars) => {}
    }
}

fn line(name: &str, s: &Snapshot, elapsed: Duration) -> String {
    if s.total_bytes == 0 {
        return format!("{name}: {}/{}", s.items, s.total_items);
    }
    let rate = s.bytes as f64 / elapsed.as_secs_f64().max(1e-9);
    let items = if s.total_items > 0 {
        format!(", {}/{}", s.items, s.total_items)
    } else {
        String::new()
    };
    format!(
        "{name}: {} of {} ({:.0}%){items}, {}/s",
        human_bytes(s.bytes),
        human_bytes(s.total_bytes),
        100.0 * s.bytes as f64 / s.total_bytes.max(1) as f64,
        human_bytes(rate as u64)
    )
}

/// Bytes in decimal units, as disks are sold.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
