//! The `wanbake` command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("inspect") || args.len() < 2 {
        eprintln!("usage: wanbake inspect FILE...");
        return ExitCode::from(2);
    }
    let mut status = 0u8;
    for p in &args[1..] {
        match wanbake::io::SafetensorsFile::open(std::path::Path::new(p)) {
            Ok(f) => {
                println!("{p}: {} tensors, {} bytes", f.infos().len(), f.len());
                for t in f.infos() {
                    println!("  {} {} {:?}", t.name, t.dtype, t.shape);
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                status = 1;
            }
        }
    }
    ExitCode::from(status)
}
