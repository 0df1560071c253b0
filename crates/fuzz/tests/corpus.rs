//! Every fuzz target over its corpus and seeds, then a short seeded mutation run: what the
//! README's test command runs on every change. `TRIBUTARY_FUZZ_SEED=<n>` replays a mutation run;
//! `TRIBUTARY_FUZZ_MS=<n>` sets its time per target (default 250 ms).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tributary_fuzz::{TARGETS, Target, seeds::seeds};

fn corpus_dir(target: &Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target.name)
}

/// The corpus files of a target, sorted by name.
fn corpus(target: &Target) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file reads");
            (path.display().to_string(), bytes)
        })
        .collect();
    files.sort();
    files
}

/// Runs the target on `input`; on a panic, says which input it was.
fn run(target: &Target, input: &[u8], what: &dyn Fn() -> String) {
    if catch_unwind(AssertUnwindSafe(|| target.run(input))).is_err() {
        let shown: Vec<String> = input.iter().take(512).map(|b| format!("{b:02x}")).collect();
        panic!(
            "fuzz target {} failed on {} ({} bytes): {}",
            target.name,
            what(),
            input.len(),
            shown.join("")
        );
    }
}

#[test]
fn every_target_has_a_corpus() {
    for target in TARGETS {
        assert!(
            !corpus(target).is_empty(),
            "fuzz/corpus/{} is empty",
            target.name
        );
    }
}

#[test]
fn every_corpus_file_and_seed_passes_its_target() {
    for target in TARGETS {
        for (name, bytes) in corpus(target) {
            run(target, &bytes, &|| name.clone());
        }
        // The seeds as today's encoders write them (the corpus holds them as they were written).
        for (i, seed) in seeds(target.name).iter().enumerate() {
            run(target, seed, &|| format!("seed {i}"));
        }
    }
}

/// One random change: what libFuzzer's mutators do most, in small.
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, donor: &[u8]) {
    const INTERESTING: [u8; 8] = [0x00, 0x01, 0x40, 0x7f, 0x80, 0xa0, 0xb0, 0xff];
    let len = input.len();
    match rng.gen_range(0..7) {
        0 if len > 0 => input[rng.gen_range(0..len)] ^= 1 << rng.gen_range(0..8),
        1 if len > 0 => input[rng.gen_range(0..len)] = INTERESTING[rng.gen_range(0..8)],
        2 => {
            let at = rng.gen_range(0..=len);
            let n = rng.gen_range(1..=8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.r#gen()).collect();
            input.splice(at..at, bytes);
        }
        3 if len > 0 => {
            let at = rng.gen_range(0..len);
            let end = len.min(at + rng.gen_range(1..=16));
            input.drain(at..end);
        }
        4 if len > 0 => input.truncate(rng.gen_range(0..len)),
        5 if !donor.is_empty() => {
            let from = rng.gen_range(0..donor.len());
            let end = donor.len().min(from + rng.gen_range(1..=64));
            let at = rng.gen_range(0..=len);
            input.splice(at..at, donor[from..end].iter().copied());
        }
        _ if len >= 4 => {
            // A length or count field somewhere: a big-endian u32 set to an edge value.
            let at = rng.gen_range(0..=len - 4);
            let value: u32 = [0, 1, 0xff, 0x100, 0x7fff_ffff, u32::MAX][rng.gen_range(0..6)];
            input[at..at + 4].copy_from_slice(&value.to_be_bytes());
        }
        _ => input.push(rng.r#gen()),
    }
}

#[test]
fn a_short_seeded_mutation_run_breaks_no_invariant() {
    let seed = std::env::var("TRIBUTARY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        });
    let budget = Duration::from_millis(
        std::env::var("TRIBUTARY_FUZZ_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(250),
    );
    eprintln!("mutation run seed {seed} (replay with TRIBUTARY_FUZZ_SEED={seed})");
    for target in TARGETS {
        let mut rng = StdRng::seed_from_u64(seed ^ fnv(target.name));
        let mut pool: Vec<Vec<u8>> = corpus(target).into_iter().map(|(_, b)| b).collect();
        pool.extend(seeds(target.name));
        let start = Instant::now();
        let mut runs = 0u64;
        while runs < 20 || (start.elapsed() < budget && runs < 100_000) {
            let mut input = pool[rng.gen_range(0..pool.len())].clone();
            let donor = &pool[rng.gen_range(0..pool.len())];
            for _ in 0..rng.gen_range(1..=4) {
                mutate(&mut rng, &mut input, donor);
            }
            run(target, &input, &|| {
                format!("mutation {runs} of seed {seed}")
            });
            runs += 1;
        }
        println!("{}: {runs} mutated inputs", target.name);
    }
}

/// A stable hash of a target's name, so each target's stream does not depend on the others.
fn fnv(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
