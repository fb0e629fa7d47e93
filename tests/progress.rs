//! Progress on a terminal: the real binary runs under a pseudo-terminal (util-linux
//! `script`), and what it wrote is played back on a small terminal model. When the command
//! is done, the screen (scrollback included) must hold exactly the command's own lines:
//! no bar frame left behind, no line of the summary erased or drawn over.

mod common;

use std::path::Path;

use common::tmp;

/// The screen after playing `bytes` back on a terminal `width` columns wide with unlimited
/// scrollback: the text, cursor moves (`CSI n A/B/C/D/G`), line and screen erases
/// (`CSI n K`, `CSI n J`) and carriage returns that indicatif and the pty emit; a line wraps
/// when a character is written past its last column (a terminal's deferred wrap). Trailing
/// blanks and empty trailing lines are dropped.
fn screen(bytes: &[u8], width: usize) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines: Vec<Vec<char>> = vec![Vec::new()];
    let (mut row, mut col, mut pending_wrap) = (0usize, 0usize, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if row >= lines.len() {
            lines.resize(row + 1, Vec::new());
        }
        match c {
            '\r' => {
                col = 0;
                pending_wrap = false;
            }
            '\n' => {
                row += 1;
                pending_wrap = false;
            }
            '\x1b' => {
                if chars.peek() != Some(&'[') {
                    chars.next();
                    continue;
                }
                chars.next();
                let mut params = String::new();
                let mut fin = '\0';
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() || d == '@' || d == '~' {
                        fin = d;
                        break;
                    }
                    params.push(d);
                }
                if params.starts_with('?') {
                    continue; // cursor visibility and other private modes
                }
                let n: usize = params.parse().unwrap_or(0);
                let line = &mut lines[row];
                match fin {
                    'A' => row = row.saturating_sub(n.max(1)),
                    'B' => row += n.max(1),
                    'C' => col = (col + n.max(1)).min(width - 1),
                    'D' => col = col.saturating_sub(n.max(1)),
                    'G' => col = n.max(1) - 1,
                    'K' => match n {
                        0 => line.truncate(col),
                        1 => line.iter_mut().take(col + 1).for_each(|c| *c = ' '),
                        _ => line.clear(),
                    },
                    'J' => {
                        if n == 0 {
                            line.truncate(col);
                            lines.truncate(row + 1);
                        } else {
                            lines.iter_mut().for_each(Vec::clear);
                        }
                    }
                    _ => {}
                }
                pending_wrap = false;
            }
            c if c.is_control() => {}
            c => {
                if pending_wrap {
                    row += 1;
                    col = 0;
                    pending_wrap = false;
                    if row >= lines.len() {
                        lines.resize(row + 1, Vec::new());
                    }
                }
                let line = &mut lines[row];
                if line.len() <= col {
                    line.resize(col + 1, ' ');
                }
                line[col] = c;
                if col + 1 == width {
                    pending_wrap = true;
                } else {
                    col += 1;
                }
            }
        }
    }
    let mut out: Vec<String> = lines
        .into_iter()
        .map(|l| l.into_iter().collect::<String>().trim_end().to_string())
        .collect();
    while out.last().is_some_and(String::is_empty) {
        out.pop();
    }
    out
}

#[test]
fn the_terminal_model_wraps_moves_and_erases_like_a_terminal() {
    assert_eq!(screen(b"abc\r\nde", 80), ["abc", "de"]);
    assert_eq!(screen(b"abcdef", 3), ["abc", "def"]);
    assert_eq!(screen(b"abc\r\n", 3), ["abc"]);
    assert_eq!(
        screen(
            b"bar1\nbar2\x1b[1A\r\x1b[2K\x1b[1B\r\x1b[2K\x1b[1Aok\r\n",
            80
        ),
        ["ok"]
    );
    assert_eq!(screen(b"xyz\x1b[1Gab\x1b[K", 80), ["ab"]);
    assert_eq!(
        screen(b"one\r\ntwo\r\n\x1b[2A\x1b[J", 80),
        Vec::<String>::new()
    );
}

/// Runs `wanbake ARGS` in `dir` on a pseudo-terminal `WIDTH` columns wide; returns (exit
/// code, everything written to the terminal).
fn on_a_terminal(dir: &Path, args: &str) -> (i32, Vec<u8>) {
    let cmd = format!(
        "stty cols {WIDTH} rows 40; exec {} {args}",
        common::bin().display()
    );
    let o = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(dir)
        .env("WANBAKE_CACHE_DIR", dir.join("cache"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("util-linux `script` runs");
    (o.status.code().unwrap_or(-1), o.stdout)
}

const WIDTH: usize = 120;

fn has_script() -> bool {
    std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A phase is shown once it has run for a second; sealing (and verifying) a 2.84 GB
/// checkpoint hashes every byte with SHA-256, at most about 2 GB/s on one core, so both
/// phases show a bar. The sparse zeros cost no disk.
#[test]
fn bars_leave_nothing_on_the_screen_and_never_touch_the_summary() {
    if !has_script() {
        eprintln!("skipped: util-linux `script` is not installed");
        return;
    }
    let t = tmp();
    let dir = t.path();
    let (code, tty) = on_a_terminal(
        dir,
        "synth --model wan2.1-t2v-1.3b --fill zero --dtype bf16 --out big",
    );
    let text = String::from_utf8_lossy(&tty);
    assert_eq!(code, 0, "{text}");
    // The bar was drawn (so the check below is not vacuous)...
    assert!(text.contains("sealing"), "no bar was drawn: {text:?}");
    // ...and afterwards the screen holds the summary alone. Its numbers, from the files.
    let sizes: Vec<u64> = ["config.json", "diffusion_pytorch_model.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(dir.join("big").join(f)).unwrap().len())
        .collect();
    assert_eq!(
        screen(&tty, WIDTH),
        // (In decimal units, as the bar counted them: one size style everywhere.)
        [format!(
            "wrote big (2 files, {:.2} GB)",
            sizes.iter().sum::<u64>() as f64 / 1e9
        )],
        "{text:?}"
    );

    // `verify` prints its summary the moment its last phase ends.
    let tensors = header_tensors(&dir.join("big/diffusion_pytorch_model.safetensors"));
    let (code, tty) = on_a_terminal(dir, "verify big");
    let text = String::from_utf8_lossy(&tty);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("verifying"), "no bar was drawn: {text:?}");
    assert_eq!(
        screen(&tty, WIDTH),
        [format!(
            "big: OK (2 files, {tensors} tensors verified; status ok)"
        )],
        "{text:?}"
    );
}

/// The number of tensors a safetensors file's header lists (read by hand: the length
/// prefix, then the JSON object less `__metadata__`).
fn header_tensors(path: &Path) -> usize {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let mut json = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut json).unwrap();
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&json).unwrap();
    header.keys().filter(|k| *k != "__metadata__").count()
}
