#!/usr/bin/env bash
# Runs the example commands of the README (or of the Markdown files given) and reports each
# one's exit status, so a flag renamed in the code or a path moved in the repository shows up as
# a failing example instead of a confused user.
#
#   bench/readme_examples.sh                      # README.md, with target/release/wanbake
#   WANBAKE=~/.cargo/bin/wanbake bench/readme_examples.sh README.md docs/signing.md
#
# What it takes: every line of a ```sh block (continuation lines joined, `# comments` cut) that
# starts with `wanbake` or `cargo run --release --`, and `openssl` (key generation for the signing
# examples, when openssl is installed); `cargo test`/`install`/`build`, and other tools' commands
# (cp, python, huggingface-cli), are listed as skipped. Each wanbake
# command runs with `bash -c`, as written, in order, in one scratch folder that holds `golden/`
# (a link to the repository's) and a copy of `recipes/`, so one example can read what an
# earlier one wrote, and the demo recipe's `../out/demo` lands in the scratch folder.
# A command is skipped, with the reason, when an input it names does not exist (a placeholder
# such as BASE or DIR, or a model to download); its flags are still checked against
# `wanbake SUBCOMMAND --help`, and an unknown flag fails it. A missing path under golden/ or
# recipes/ fails it too (those are bundled). Values of skipped commands are not checked.
# Exit status: 0 when every command run passed and every flag exists, 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WANBAKE=${WANBAKE:-$ROOT/target/release/wanbake}
WANBAKE=$(cd "$(dirname "$WANBAKE")" && pwd)/$(basename "$WANBAKE")
[ -x "$WANBAKE" ] || { echo "no wanbake binary at $WANBAKE (cargo build --release, or set WANBAKE)" >&2; exit 2; }
TIMEOUT=${TIMEOUT:-600}
[ $# -gt 0 ] || set -- "$ROOT/README.md"

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/wanbake-readme.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$SCRATCH/bin"
ln -s "$WANBAKE" "$SCRATCH/bin/wanbake"
ln -s "$ROOT/golden" "$SCRATCH/golden"
cp -r "$ROOT/recipes" "$SCRATCH/recipes"
export PATH="$SCRATCH/bin:$PATH" WANBAKE_CACHE_DIR="$SCRATCH/.hash-cache"

# file:line<TAB>command, one per example.
extract() {
    awk -v f="$1" '
        /^```sh[ \t]*$/ { insh = 1; next }
        /^```/          { insh = 0; cont = ""; next }
        !insh           { next }
        {
            line = $0
            if (hd != "") { if (line == hd) hd = ""; next }   # body of a here-document
            if (cont == "") start = FNR
            if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); cont = cont line " "; next }
            cmd = cont line; cont = ""
            sub(/[ \t]+#.*$/, "", cmd); sub(/^[ \t]+/, "", cmd); gsub(/[ \t]+/, " ", cmd)
            if (match(cmd, /<<-?[ \t]*[\047"]?[A-Za-z_]+/)) {
                hd = substr(cmd, RSTART, RLENGTH); gsub(/^<<-?[ \t]*[\047"]?/, "", hd)
            }
            if (cmd != "") printf "%s:%d\t%s\n", f, start, cmd
        }' "$1"
}

# The flags (with their value names) a subcommand's --help lists.
declare -A HELP
help_of() {
    [ -n "${HELP[$1]+x}" ] || HELP[$1]=$("$WANBAKE" "$1" --help 2>/dev/null)
    printf '%s' "${HELP[$1]}"
}
# (here-strings, not pipes: `grep -q` closing a pipe early fails it under pipefail)
takes_value() { grep -Eq -- "(^|[ ,])$2 <" <<<"$(help_of "$1")"; }
has_flag() { grep -Eq -- "(^|[ ,])$2([ ,=]|$)" <<<"$(help_of "$1")"; }

# Input paths a command names: positional operands, and the values of the flags that read a file.
inputs_of() {
    local sub=$1; shift
    local -a args=("$@")
    local i=0 a v
    while [ $i -lt ${#args[@]} ]; do
        a=${args[$i]}
        case $a in
            -*)
                local flag=${a%%=*} val=
                if [[ $a == *=* ]]; then val=${a#*=};
                elif takes_value "$sub" "$flag"; then i=$((i + 1)); val=${args[$i]:-}; fi
                case $flag in
                    --base|--tuned|--inputs|--key|--public-key|--svd-cache) echo "$val" ;;
                    --model) [ "$sub" = run ] && echo "$val" ;;
                    --signature) [ "$sub" = verify ] && echo "$val" ;;
                    --adapter) v=${val#*=}; [[ $val == ./* || $val != *=* ]] && v=$val
                               [[ $v =~ :[-+0-9.eE]+$ ]] && v=${v%:*}; echo "$v" ;;
                esac ;;
            *) [ "$sub" != synth ] && echo "$a" ;;
        esac
        i=$((i + 1))
    done
}

pass=0 fail=0 skip=0
report() { printf '%-5s %-24s %s\n' "$1" "$2" "$3"; [ -n "${4:-}" ] && printf '      %s\n' "$4"; }

for md in "$@"; do
    rel=${md#"$ROOT"/}
    while IFS=$'\t' read -r where cmd; do
        where=${where#"$ROOT"/}
        run=$cmd
        case $cmd in
            "cargo run --release -- "*) run="wanbake ${cmd#cargo run --release -- }" ;;
            "cargo test"*|"cargo install"*|"cargo build"*|"cargo uninstall"*)
                report SKIP "$where" "$cmd" "builds or tests the crate itself (not rerun here)"; skip=$((skip + 1)); continue ;;
            wanbake|"wanbake "*) ;;
            "openssl "*)   # key generation for the signing examples: run when openssl is there
                if ! command -v openssl >/dev/null; then
                    report SKIP "$where" "$cmd" "openssl is not installed"; skip=$((skip + 1)); continue
                fi
                out=$(cd "$SCRATCH" && bash -c "$cmd" 2>&1); rc=$?
                if [ $rc -eq 0 ]; then report PASS "$where" "$cmd" "exit 0"; pass=$((pass + 1))
                else report FAIL "$where" "$cmd" "exit $rc: $out"; fail=$((fail + 1)); fi
                continue ;;
            *)  report SKIP "$where" "$cmd" "not a wanbake command (another tool's step)"; skip=$((skip + 1)); continue ;;
        esac
        read -ra words <<<"${run//\"/}"
        sub=${words[1]:-}
        if [[ $sub == -* || -z $sub ]]; then sub=""; fi
        bad=()
        if [ -n "$sub" ]; then
            help_of "$sub" >/dev/null
            if [ -z "${HELP[$sub]}" ]; then bad+=("unknown subcommand $sub"); fi
            for w in "${words[@]:2}"; do
                [[ $w == -* ]] || continue
                f=${w%%=*}
                has_flag "$sub" "$f" || bad+=("unknown flag $f")
            done
        fi
        if [ ${#bad[@]} -gt 0 ]; then
            report FAIL "$where" "$cmd" "${bad[*]} (wanbake $sub --help)"; fail=$((fail + 1)); continue
        fi
        missing=""
        if [ -n "$sub" ]; then
            while read -r p; do
                [ -z "$p" ] && continue
                (cd "$SCRATCH" && [ -e "$p" ]) || { missing=$p; break; }
            done < <(inputs_of "$sub" "${words[@]:2}")
        fi
        if [[ $missing == golden/* || $missing == recipes/* ]]; then
            report FAIL "$where" "$cmd" "names $missing, which the repository does not have"
            fail=$((fail + 1)); continue
        fi
        if [ -n "$missing" ]; then
            report SKIP "$where" "$cmd" "needs $missing (not bundled: a placeholder or a download); flags checked"
            skip=$((skip + 1)); continue
        fi
        out=$(cd "$SCRATCH" && timeout "$TIMEOUT" bash -c "$run" 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then
            report PASS "$where" "$cmd" "exit 0"; pass=$((pass + 1))
        else
            report FAIL "$where" "$cmd" "exit $rc: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"; fail=$((fail + 1))
        fi
    done < <(extract "$md")
done

echo "passed $pass, failed $fail, skipped $skip ($WANBAKE, $("$WANBAKE" --version))"
[ $fail -eq 0 ]
