//! Throttling: token buckets keyed by what a limit applies to, on tokio's monotonic clock.
//!
//! A bucket holds up to one second's worth of its rate and refills continuously; a request
//! that finds too few tokens is refused whole (429 `TooManyRequests`) and takes none. The map of
//! buckets is bounded by [`crate::limits::RATE_BUCKETS_MAX`]: when full, buckets that have
//! refilled completely (idle ones) are dropped, which changes nothing for anyone.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::limits::RATE_BUCKETS_MAX;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets with one rate.
#[derive(Debug)]
pub(crate) struct Buckets {
    per_second: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Buckets {
    pub(crate) fn new(per_second: u64) -> Self {
        assert!(per_second > 0, "a rate of 0 is configured as no limit");
        Buckets {
            per_second: per_second as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `cost` tokens from each of `keys` if every one has them; otherwise takes none and
    /// returns the first key that had too few.
    pub(crate) fn take_all<'a>(
        &self,
        keys: &[(&'a str, u64)],
        now: Instant,
    ) -> Result<(), &'a str> {
        let mut buckets = self.buckets.lock().expect("rate buckets");
        if buckets.len() + keys.len() > RATE_BUCKETS_MAX {
            let rate = self.per_second;
            buckets.retain(|_, b| refilled(b, rate, now) < rate);
        }
        let mut updated = Vec::with_capacity(keys.len());
        for &(key, cost) in keys {
            let bucket = buckets.get(key).copied().unwrap_or(Bucket {
                tokens: self.per_second,
                at: now,
            });
            let tokens = refilled(&bucket, self.per_second, now);
            // A single request larger than a whole second's worth may pass when the bucket is
            // full, or it could never pass at all.
            let cost = (cost as f64).min(self.per_second);
            if tokens < cost {
                return Err(key);
            }
            updated.push((key, tokens - cost));
        }
        for (key, tokens) in updated {
            buckets.insert(key.to_owned(), Bucket { tokens, at: now });
        }
        Ok(())
    }
}

fn refilled(b: &Bucket, per_second: f64, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
    (b.tokens + elapsed * per_second).min(per_second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn refuses_beyond_the_rate_and_refills() {
        let b = Buckets::new(5);
        let now = Instant::now();
        for _ in 0..5 {
            b.take_all(&[("p0", 1)], now).unwrap();
        }
        assert_eq!(b.take_all(&[("p0", 1)], now), Err("p0"));
        b.take_all(&[("p1", 1)], now).unwrap();
        assert_eq!(b.take_all(&[("p1", 1), ("p0", 1)], now), Err("p0"));
        let later = now + Duration::from_millis(200);
        b.take_all(&[("p0", 1)], later).unwrap();
        assert_eq!(b.take_all(&[("p0", 1)], later), Err("p0"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_request_takes_nothing() {
        let b = Buckets::new(10);
        let now = Instant::now();
        b.take_all(&[("a", 8)], now).unwrap();
        assert_eq!(b.take_all(&[("b", 5), ("a", 5)], now), Err("a"));
        b.take_all(&[("b", 10)], now).unwrap();
    }
}
