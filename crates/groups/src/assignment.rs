//! Which instance of a group reads which partition: balanced to ±1 and sticky.
//!
//! [`assign`] is a pure function of the partition count, the live instances and who holds what
//! now. Every partition goes to exactly one instance (when there is any); every instance gets
//! `floor(P/N)` or `ceil(P/N)` partitions; and of all assignments with those counts it picks one
//! that moves the fewest partitions: an instance keeps as many of its current partitions as its
//! quota allows, the instances that hold the most now get the larger quotas, and only what is
//! freed or unowned is handed out. So one instance joining a balanced group takes only its own
//! share, from the instances above quota; one leaving hands out only what it held.

use std::collections::{BTreeMap, BTreeSet};

/// The partitions each instance holds, by instance name.
pub type Assignment = BTreeMap<String, BTreeSet<u32>>;

/// The balanced, sticky assignment of `partition_count` partitions to `instances`, starting from
/// `current` (partitions of instances not in `instances`, and ids not below `partition_count`, are
/// treated as unowned).
pub fn assign(
    partition_count: u32,
    instances: &BTreeSet<String>,
    current: &Assignment,
) -> Assignment {
    let mut target: Assignment = instances
        .iter()
        .map(|i| (i.clone(), BTreeSet::new()))
        .collect();
    if instances.is_empty() {
        return target;
    }
    let n = u32::try_from(instances.len()).unwrap_or(u32::MAX);
    let base = partition_count / n;
    let extra = partition_count % n;
    let quotas = quotas(instances, current, partition_count, base, extra);
    let mut owned = vec![false; partition_count as usize];
    for (instance, quota) in &quotas {
        let kept = target
            .get_mut(instance)
            .expect("every instance has an entry");
        let held = current.get(instance).into_iter().flatten();
        for &p in held.filter(|&&p| p < partition_count).take(*quota as usize) {
            kept.insert(p);
            owned[p as usize] = true;
        }
    }
    let mut free = (0..partition_count).filter(|&p| !owned[p as usize]);
    for (instance, quota) in &quotas {
        let set = target
            .get_mut(instance)
            .expect("every instance has an entry");
        while (set.len() as u32) < *quota {
            let p = free.next().expect("quotas add up to the partition count");
            set.insert(p);
        }
    }
    assert!(free.next().is_none(), "every partition is assigned");
    target
}

/// Each instance's quota: `base + 1` for the `extra` instances that hold the most partitions now
/// (ties broken by name), `base` for the rest.
fn quotas(
    instances: &BTreeSet<String>,
    current: &Assignment,
    partition_count: u32,
    base: u32,
    extra: u32,
) -> Vec<(String, u32)> {
    let held = |i: &String| {
        current
            .get(i)
            .map_or(0, |s| s.iter().filter(|&&p| p < partition_count).count())
    };
    let mut by_holdings: Vec<&String> = instances.iter().collect();
    by_holdings.sort_by(|a, b| held(b).cmp(&held(a)).then_with(|| a.cmp(b)));
    let quotas: Vec<(String, u32)> = by_holdings
        .into_iter()
        .enumerate()
        .map(|(rank, i)| (i.clone(), base + u32::from((rank as u32) < extra)))
        .collect();
    assert_eq!(quotas.iter().map(|(_, q)| q).sum::<u32>(), partition_count);
    quotas
}

/// How many partitions change owner between two assignments (a partition that had no owner
/// counts as moved when it gets one).
pub fn moves(before: &Assignment, after: &Assignment) -> usize {
    let owner = |a: &Assignment| -> BTreeMap<u32, String> {
        a.iter()
            .flat_map(|(i, ps)| ps.iter().map(move |p| (*p, i.clone())))
            .collect()
    };
    let (b, a) = (owner(before), owner(after));
    a.iter().filter(|(p, i)| b.get(p) != Some(i)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("i{i:02}")).collect()
    }

    fn check_balanced(partition_count: u32, instances: &BTreeSet<String>, a: &Assignment) {
        let mut seen = BTreeSet::new();
        for set in a.values() {
            for p in set {
                assert!(seen.insert(*p), "partition {p} assigned twice");
            }
        }
        if instances.is_empty() {
            assert!(seen.is_empty());
            return;
        }
        assert_eq!(
            seen.len() as u32,
            partition_count,
            "every partition assigned"
        );
        let n = instances.len() as u32;
        for (i, set) in a {
            let c = set.len() as u32;
            assert!(
                c == partition_count / n || c == partition_count.div_ceil(n),
                "{i} has {c}"
            );
        }
    }

    #[test]
    fn one_to_twelve_instances_over_ten_partitions() {
        let mut current = Assignment::new();
        for n in 1..=12 {
            let instances = names(n);
            let next = assign(10, &instances, &current);
            check_balanced(10, &instances, &next);
            // A join moves exactly what the newcomer takes, nothing else.
            let newcomer = format!("i{:02}", n - 1);
            assert_eq!(
                moves(&current, &next),
                next[&newcomer].len(),
                "join of instance {n}"
            );
            current = next;
        }
        let idle = current.values().filter(|s| s.is_empty()).count();
        assert_eq!(idle, 2, "instances beyond the partition count get nothing");
        for n in (1..12).rev() {
            let instances = names(n);
            let leaver = format!("i{n:02}");
            let next = assign(10, &instances, &current);
            check_balanced(10, &instances, &next);
            // A leave moves exactly what the leaver held.
            assert_eq!(
                moves(&current, &next),
                current[&leaver].len(),
                "leave down to {n}"
            );
            current = next;
        }
    }

    #[test]
    fn ten_partitions_four_instances_is_three_three_two_two() {
        let a = assign(10, &names(4), &Assignment::new());
        let mut counts: Vec<usize> = a.values().map(BTreeSet::len).collect();
        counts.sort_unstable();
        assert_eq!(counts, vec![2, 2, 3, 3]);
    }

    #[test]
    fn no_instances_no_assignment() {
        assert!(assign(4, &BTreeSet::new(), &Assignment::new()).is_empty());
    }

    fn arbitrary_current(
        partition_count: u32,
        instances: usize,
    ) -> impl Strategy<Value = Assignment> {
        // Each partition is held by one of the instances, by a departed one, or by nobody.
        proptest::collection::vec(0..instances + 2, partition_count as usize).prop_map(
            move |owners| {
                let mut a = Assignment::new();
                for (p, o) in owners.into_iter().enumerate() {
                    if o < instances + 1 {
                        a.entry(format!("i{o:02}")).or_default().insert(p as u32);
                    }
                }
                a
            },
        )
    }

    proptest! {
        #[test]
        fn balanced_sticky_and_minimal(
            (partition_count, n, current) in (1u32..40, 1usize..15)
                .prop_flat_map(|(p, n)| (Just(p), Just(n), arbitrary_current(p, n)))
        ) {
            let instances = names(n);
            let next = assign(partition_count, &instances, &current);
            check_balanced(partition_count, &instances, &next);
            // Minimal: no assignment with legal counts keeps more of the live instances'
            // current partitions. The best possible keeps, per instance, min(held, quota) with the
            // larger quotas on the largest holders.
            let mut held: Vec<u32> = instances.iter()
                .map(|i| current.get(i).map_or(0, |s| s.len() as u32)).collect();
            held.sort_unstable_by(|a, b| b.cmp(a));
            let (base, extra) = (partition_count / n as u32, partition_count % n as u32);
            let best_kept: u32 = held.iter().enumerate()
                .map(|(rank, h)| (*h).min(base + u32::from((rank as u32) < extra))).sum();
            let kept: u32 = next.iter()
                .map(|(i, s)| s.intersection(current.get(i).unwrap_or(&BTreeSet::new())).count() as u32)
                .sum();
            prop_assert_eq!(kept, best_kept);
            // Sticky: running it again on its own output changes nothing.
            prop_assert_eq!(assign(partition_count, &instances, &next), next);
        }
    }
}
