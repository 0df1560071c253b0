//! `serve`'s throughput-limit flags: `--throughput-units`, `--ingress-limit`, `--egress-limit`
//! and `--hub-limit`, parsed into the broker's [`ThroughputLimits`] (see
//! `tributary_broker::throttle` for what the doors do over a limit).
//!
//! A rate is a comma-separated list of `<size>/s` (bytes, as `--retention-bytes` takes them:
//! `512KiB/s`, `1MB/s`) and `<n>ev/s` (events), e.g. `1MiB/s,1000ev/s`. A hub's limits are
//! `HUB:ingress=<rate>,egress=<rate>`, either direction optional, e.g.
//! `orders:ingress=256KiB/s,250ev/s,egress=1MiB/s`. Limits of 0 are refused: no flag means no
//! limit.

use std::collections::BTreeMap;

use tributary_broker::throttle::{DirectionLimits, Rate, ThroughputLimits};

use crate::args::parse_bytes;

/// The most throughput units `--throughput-units` takes (Event Hubs' dedicated clusters stop
/// well before this; beyond it the figure is surely a typo).
pub const THROUGHPUT_UNITS_MAX: u64 = 1000;

/// Parses `--throughput-units`: 1 to [`THROUGHPUT_UNITS_MAX`].
pub fn parse_throughput_units(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=THROUGHPUT_UNITS_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid throughput units {s:?}: expected a whole number from 1 to {THROUGHPUT_UNITS_MAX}"
        )),
    }
}

/// Parses a rate: `1MiB/s`, `1000ev/s` or both, comma-separated.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let mut rate = Rate::default();
    for item in s.split(',') {
        add_to_rate(&mut rate, item.trim())?;
    }
    Ok(rate)
}

fn add_to_rate(rate: &mut Rate, item: &str) -> Result<(), String> {
    let Some(amount) = item.strip_suffix("/s") else {
        return Err(format!(
            "invalid rate {item:?}: expected <size>/s (e.g. 1MiB/s) or <n>ev/s (e.g. 1000ev/s)"
        ));
    };
    if let Some(events) = amount.strip_suffix("ev") {
        let n = events
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("invalid rate {item:?}: events per second must be above 0"))?;
        if rate.events_per_second.replace(n).is_some() {
            return Err(format!(
                "invalid rate {item:?}: events per second given twice"
            ));
        }
        return Ok(());
    }
    let bytes = parse_bytes(amount).map_err(|e| format!("invalid rate {item:?}: {e}"))?;
    if rate.bytes_per_second.replace(bytes).is_some() {
        return Err(format!(
            "invalid rate {item:?}: bytes per second given twice"
        ));
    }
    Ok(())
}

/// Parses `--hub-limit HUB:ingress=<rate>,egress=<rate>`.
pub fn parse_hub_limit(s: &str) -> Result<(String, DirectionLimits), String> {
    let (hub, spec) = s.split_once(':').ok_or_else(|| {
        format!("invalid hub limit {s:?}: expected HUB:ingress=<rate>,egress=<rate>")
    })?;
    tributary_event::names::validate_hub_name(hub)
        .map_err(|e| format!("invalid hub limit {s:?}: {e}"))?;
    let mut limits = DirectionLimits::default();
    let mut current: Option<&mut Rate> = None;
    for item in spec.split(',').map(str::trim) {
        let item = if let Some(rest) = item.strip_prefix("ingress=") {
            current = Some(&mut limits.ingress);
            rest
        } else if let Some(rest) = item.strip_prefix("egress=") {
            current = Some(&mut limits.egress);
            rest
        } else {
            item
        };
        let Some(rate) = current.as_deref_mut() else {
            return Err(format!(
                "invalid hub limit {s:?}: say ingress= or egress= first"
            ));
        };
        add_to_rate(rate, item).map_err(|e| format!("invalid hub limit {s:?}: {e}"))?;
    }
    if !limits.ingress.is_limited() && !limits.egress.is_limited() {
        return Err(format!("invalid hub limit {s:?}: no limit given"));
    }
    Ok((hub.to_owned(), limits))
}

/// The limits the flags describe: the namespace's from the throughput units, each direction
/// replaced by `--ingress-limit` / `--egress-limit` when given; and the hubs'. A hub named
/// twice is an error.
pub fn limits(
    throughput_units: Option<u64>,
    ingress: Option<Rate>,
    egress: Option<Rate>,
    hubs: &[(String, DirectionLimits)],
) -> Result<ThroughputLimits, String> {
    let mut namespace =
        throughput_units.map_or_else(DirectionLimits::default, DirectionLimits::throughput_units);
    if let Some(rate) = ingress {
        namespace.ingress = rate;
    }
    if let Some(rate) = egress {
        namespace.egress = rate;
    }
    let mut by_hub = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    for (hub, l) in hubs {
        if !seen.insert(tributary_event::names::name_key(hub)) {
            return Err(format!("--hub-limit names event hub {hub:?} twice"));
        }
        by_hub.insert(hub.clone(), *l);
    }
    Ok(ThroughputLimits {
        namespace,
        hubs: by_hub,
    })
}

/// The banner's lines for the limits in force: one for the namespace and one per hub, none
/// when nothing is limited.
pub fn describe(limits: &ThroughputLimits) -> Vec<String> {
    let scopes = std::iter::once(("namespace".to_owned(), &limits.namespace)).chain(
        limits
            .hubs
            .iter()
            .map(|(hub, l)| (format!("event hub {hub:?}"), l)),
    );
    scopes
        .filter(|(_, l)| l.ingress.is_limited() || l.egress.is_limited())
        .map(|(scope, l)| {
            format!(
                "throughput limits of the {scope}: ingress {}, egress {}",
                rate_text(l.ingress),
                rate_text(l.egress)
            )
        })
        .collect()
}

fn rate_text(rate: Rate) -> String {
    let parts: Vec<String> = [
        rate.bytes_per_second.map(|b| format!("{b} B/s")),
        rate.events_per_second.map(|e| format!("{e} events/s")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "unlimited".to_owned()
    } else {
        parts.join(" or ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_names_each_limited_scope() {
        assert!(describe(&ThroughputLimits::default()).is_empty());
        let hub = parse_hub_limit("orders:egress=1KiB/s").unwrap();
        let l = limits(Some(1), None, None, &[hub]).unwrap();
        assert_eq!(
            describe(&l),
            [
                "throughput limits of the namespace: ingress 1048576 B/s or 1000 events/s, egress 2097152 B/s or 4096 events/s",
                "throughput limits of the event hub \"orders\": ingress unlimited, egress 1024 B/s",
            ]
        );
    }

    #[test]
    fn rates_parse_bytes_and_events() {
        let r = parse_rate("1MiB/s,1000ev/s").unwrap();
        assert_eq!(r.bytes_per_second, Some(1 << 20));
        assert_eq!(r.events_per_second, Some(1000));
        let r = parse_rate("500ev/s").unwrap();
        assert_eq!((r.bytes_per_second, r.events_per_second), (None, Some(500)));
        assert_eq!(parse_rate("64KB/s").unwrap().bytes_per_second, Some(64_000));
        for bad in [
            "",
            "1MiB",
            "0ev/s",
            "0B/s",
            "1MiB/s,2MiB/s",
            "xev/s",
            "1Mb/s",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hub_limits_parse_both_directions() {
        let (hub, l) = parse_hub_limit("orders:ingress=256KiB/s,250ev/s,egress=1MiB/s").unwrap();
        assert_eq!(hub, "orders");
        assert_eq!(l.ingress.bytes_per_second, Some(256 << 10));
        assert_eq!(l.ingress.events_per_second, Some(250));
        assert_eq!(l.egress.bytes_per_second, Some(1 << 20));
        assert_eq!(l.egress.events_per_second, None);
        for bad in [
            "orders",
            "orders:",
            "orders:1MiB/s",
            ":ingress=1MiB/s",
            "a b:egress=1ev/s",
        ] {
            assert!(parse_hub_limit(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn explicit_limits_replace_the_throughput_units_direction() {
        let ingress = parse_rate("100ev/s").unwrap();
        let l = limits(Some(2), Some(ingress), None, &[]).unwrap();
        assert_eq!(l.namespace.ingress, ingress);
        assert_eq!(
            l.namespace.egress,
            DirectionLimits::throughput_units(2).egress
        );
        let hub = parse_hub_limit("h:egress=1ev/s").unwrap();
        let twice = [hub.clone(), ("H".to_owned(), hub.1)];
        assert!(limits(None, None, None, &twice).is_err());
        assert_eq!(
            parse_throughput_units("0"),
            Err(
                "invalid throughput units \"0\": expected a whole number from 1 to 1000".to_owned()
            )
        );
        assert_eq!(parse_throughput_units("40"), Ok(40));
    }
}
