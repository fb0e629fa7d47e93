//! Showing the library's progress board (`wanbake::progress`) while a command works: one
//! indicatif bar per running phase on a terminal (hashing inputs and writing overlap, so
//! both are shown), plain lines elsewhere (when a phase has run for a second, then every
//! 10 % or 10 s, and when it ends), nothing with `--quiet` or `--json`. A phase shorter than
//! a second is never shown.
//!
//! The bars and the command's own lines share one terminal, so every line the command
//! prints goes through the [`Screen`] (the `Printer` does this): under its lock the bars
//! of phases that have ended are cleared first, and the bars still running are taken off
//! the screen while the line is written and drawn again below it. Without that, a summary
//! printed right after the last phase ended lands on that phase's last frame and the bar's
//! later clear erases it. A bar is attached to the `MultiProgress` before it is first drawn
//! (a bar drawn on its own first leaves that frame in the scrollback).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wanbake::human::size;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use wanbake::progress::{self, Phase, Snapshot};

use super::stdio::{self, Stream};

/// How progress is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Show {
    Bars,
    Lines,
}

/// How long a phase runs before it is shown.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Runs `work` while a watcher thread shows every phase on the board (when `human`: not
/// `--quiet`, not `--json`). `work` gets the screen to print its own lines through (`None`
/// when nothing is shown); when `watching` returns, every bar has been cleared.
pub fn watching<T>(human: bool, work: impl FnOnce(Option<&Screen>) -> T) -> T {
    if !human {
        return work(None);
    }
    // Bars only on a terminal, which never answers EPIPE: indicatif ignores the write errors
    // of a bar's frames, but `MultiProgress::suspend` (`Screen::print`) unwraps those of its
    // clear and redraw (0.18). Lines go through `stdio::line`, which never panics.
    let screen = if std::io::stderr().is_terminal() {
        Screen::new(Show::Bars, MultiProgress::new(), SHOW_AFTER)
    } else {
        Screen::new(Show::Lines, MultiProgress::new(), SHOW_AFTER)
    };
    // Dropping the sender wakes the watcher at once (a sleeping watcher would add its
    // polling interval to every command).
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let watcher = screen.clone();
        s.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(Duration::from_millis(100))
            {
                watcher.sync();
            }
            watcher.finish_all();
        });
        let out = work(Some(&screen));
        drop(done);
        out
    })
}

/// The bars (or progress lines) on the terminal, shared by the watcher thread and the
/// command's printer.
#[derive(Clone)]
pub struct Screen(Arc<Mutex<Watch>>);

/// What the watcher shows.
struct Watch {
    show: Show,
    multi: MultiProgress,
    shown: BTreeMap<u64, Shown>,
    after: Duration,
}

/// What the watcher shows of one phase.
struct Shown {
    phase: Arc<Phase>,
    bar: Option<ProgressBar>,
    last_line: (u64, Instant),
}

impl Screen {
    fn new(show: Show, multi: MultiProgress, after: Duration) -> Screen {
        Screen(Arc::new(Mutex::new(Watch {
            show,
            multi,
            shown: BTreeMap::new(),
            after,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Watch> {
        // A panic while drawing leaves nothing half-done that matters here.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the command's own output (`print` writes it): the bars of phases that have
    /// ended are cleared first, and those still running are lifted off the screen while it
    /// is written, then drawn again below it.
    pub fn print<R>(&self, print: impl FnOnce() -> R) -> R {
        let mut w = self.lock();
        w.clear_ended(&progress::board());
        match w.show {
            Show::Bars => w.multi.suspend(print),
            Show::Lines => print(),
        }
    }

    /// Brings the screen up to date with the board: ended phases cleared, running ones
    /// drawn (once they have run for `after`).
    fn sync(&self) {
        let board = progress::board();
        let mut w = self.lock();
        w.clear_ended(&board);
        for phase in board {
            if phase.started.elapsed() < w.after {
                continue;
            }
            let Watch {
                show, multi, shown, ..
            } = &mut *w;
            let s = shown.entry(phase.id).or_insert_with(|| Shown {
                bar: (*show == Show::Bars).then(|| new_bar(multi, &phase)),
                last_line: (u64::MAX, Instant::now()),
                phase: phase.clone(),
            });
            update(s);
        }
    }

    /// Clears every bar (the command is done).
    fn finish_all(&self) {
        let mut w = self.lock();
        let show = w.show;
        for (_, s) in std::mem::take(&mut w.shown) {
            finish(&w.multi, s, show);
        }
    }
}

impl Watch {
    /// Clears what is shown of phases no longer on `board`.
    fn clear_ended(&mut self, board: &[Arc<Phase>]) {
        let ended: Vec<u64> = self
            .shown
            .keys()
            .filter(|id| !board.iter().any(|p| p.id == **id))
            .copied()
            .collect();
        for id in ended {
            if let Some(s) = self.shown.remove(&id) {
                finish(&self.multi, s, self.show);
            }
        }
    }
}

/// A bar for `phase`, in `multi` before anything draws it: created hidden, so the frames
/// that setting its style and prefix draw go through `multi` and nowhere else.
fn new_bar(multi: &MultiProgress, phase: &Phase) -> ProgressBar {
    let snap = phase.progress.snapshot();
    let (len, template) = if snap.total_bytes > 0 {
        (
            snap.total_bytes,
            // Decimal units, as every size wanbake prints (`wanbake::human::size`).
            "{prefix:>15} {bar:40} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta} {msg}",
        )
    } else {
        (
            snap.total_items,
            "{prefix:>15} {bar:40} {pos}/{len} {elapsed}",
        )
    };
    let b = multi.add(ProgressBar::with_draw_target(
        Some(len),
        ProgressDrawTarget::hidden(),
    ));
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
        stdio::line(
            Stream::Stderr,
            line(&s.phase.name, &snap, s.phase.started.elapsed()),
        );
        s.last_line = (tenth, Instant::now());
    }
}

fn finish(multi: &MultiProgress, s: Shown, show: Show) {
    match (&s.bar, show) {
        (Some(b), _) => {
            b.finish_and_clear();
            multi.remove(b);
        }
        (None, Show::Lines) => stdio::line(
            Stream::Stderr,
            format_args!(
                "{}: done in {:.1} s",
                s.phase.name,
                s.phase.started.elapsed().as_secs_f64()
            ),
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
        size(s.bytes),
        size(s.total_bytes),
        100.0 * s.bytes as f64 / s.total_bytes.max(1) as f64,
        size(rate as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal that keeps its lines (scrollback included): indicatif's drawing and the
    /// command's lines both land here, in the order they happen.
    #[derive(Debug, Clone, Default)]
    struct Terminal(Arc<Mutex<(Vec<String>, usize)>>);

    impl Terminal {
        fn with<R>(&self, f: impl FnOnce(&mut Vec<String>, &mut usize) -> R) -> R {
            let mut g = self.0.lock().unwrap();
            let (lines, row) = &mut *g;
            if lines.len() <= *row {
                lines.resize(*row + 1, String::new());
            }
            f(lines, row)
        }

        fn screen(&self) -> Vec<String> {
            let mut lines = self.0.lock().unwrap().0.clone();
            while lines.last().is_some_and(|l| l.trim().is_empty()) {
                lines.pop();
            }
            lines
        }
    }

    impl indicatif::TermLike for Terminal {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
            self.with(|_, row| *row = row.saturating_sub(n));
            Ok(())
        }
        fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
            self.with(|_, row| *row += n);
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.with(|lines, row| {
                lines[*row].push_str(s);
                *row += 1;
            });
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.with(|lines, row| lines[*row].push_str(s));
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.with(|lines, row| lines[*row].clear());
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn bars_on(term: &Terminal) -> Screen {
        let multi =
            MultiProgress::with_draw_target(ProgressDrawTarget::term_like(Box::new(term.clone())));
        Screen::new(Show::Bars, multi, Duration::ZERO)
    }

    /// The board is process-wide, so both cases run in one test (no other test in this
    /// crate puts a phase on it).
    #[test]
    fn lines_and_bars_share_the_terminal_without_erasing_each_other() {
        // A summary printed the moment the last phase ends (before the watcher's next
        // poll) stays on the screen whole, and the bar leaves nothing.
        let term = Terminal::default();
        let screen = bars_on(&term);
        let phase = progress::begin("writing", 100, 2);
        phase.item_done(50);
        screen.sync();
        assert!(
            term.screen().iter().any(|l| l.contains("writing")),
            "{:?}",
            term.screen()
        );
        drop(phase);
        screen.print(|| {
            indicatif::TermLike::write_line(&term, "wrote out (2 files)").unwrap();
        });
        screen.sync();
        screen.finish_all();
        assert_eq!(term.screen(), ["wrote out (2 files)"]);

        // A line printed while a phase runs goes above its bar; the bar, cleared when the
        // phase ends, takes nothing else with it.
        let term = Terminal::default();
        let screen = bars_on(&term);
        let phase = progress::begin("checking", 0, 3);
        screen.sync();
        screen.print(|| {
            indicatif::TermLike::write_line(&term, "check a: passed").unwrap();
        });
        phase.add_item();
        screen.sync();
        let shown = term.screen();
        assert_eq!(shown[0], "check a: passed", "{shown:?}");
        assert!(shown[1].contains("checking"), "{shown:?}");
        drop(phase);
        screen.sync();
        screen.print(|| {
            indicatif::TermLike::write_line(&term, "summary").unwrap();
        });
        screen.finish_all();
        assert_eq!(term.screen(), ["check a: passed", "summary"]);
    }
}
