//! The `DPLS` step codec from outside the crate: property-based round trips, and a
//! counting allocator proving that forged lengths are refused before allocating.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dpledger::store::codec::{CodecError, StepPayload};
use proptest::prelude::*;

/// Counts the bytes allocated by the current thread while `COUNTING` is set.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = COUNTING.try_with(|counting| {
            if counting.get() {
                let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
            }
        });
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Bytes allocated on this thread while running `f`.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    ALLOCATED.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATED.with(Cell::get))
}

fn forged(n_ids: u64, n_norms: u64, flags: u8, tail: usize) -> Vec<u8> {
    let mut b = b"DPLS".to_vec();
    b.push(1);
    b.push(flags);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&n_ids.to_le_bytes());
    b.extend_from_slice(&n_norms.to_le_bytes());
    b.extend(std::iter::repeat_n(0x01u8, tail));
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn forged_counts_allocate_nothing_proportional_to_the_claim() {
    for (n_ids, n_norms, flags) in [
        (u64::MAX, u64::MAX, 0u8),
        (1 << 40, 0, 0),
        (0, 1 << 40, 0),
        (1 << 40, 1, 0x08),
        (1_000_000, 1_000_000, 0x08),
    ] {
        let bytes = forged(n_ids, n_norms, flags, 64);
        let (result, allocated) = allocated_by(|| StepPayload::decode(&bytes));
        let err = result.unwrap_err();
        assert!(matches!(err, CodecError::CountTooLarge { .. }), "{err}");
        // The error message itself allocates a little; nothing like n * 8.
        assert!(
            allocated < 4096,
            "{n_ids}/{n_norms}: allocated {allocated} bytes"
        );
    }
}

#[test]
fn decoding_allocates_in_proportion_to_the_input() {
    let p = StepPayload {
        step: 9,
        part: None,
        noise_multiplier: None,
        sampling_rate: None,
        ids: (0..4096).collect(),
        norms: vec![1.0; 4096],
    };
    let bytes = p.encode();
    let (decoded, allocated) = allocated_by(|| StepPayload::decode(&bytes));
    assert_eq!(decoded.unwrap().ids.len(), 4096);
    // ids (8 B each) + norms (8 B each), once, from an input of ~45 KB.
    assert!(allocated <= 2 * 4096 * 8 + 1024, "allocated {allocated}");
}

fn any_f64() -> impl Strategy<Value = f64> {
    any::<u64>().prop_map(f64::from_bits)
}

prop_compose! {
    fn payloads()(
        step in any::<u64>(),
        part in proptest::option::of((any::<u32>(), any::<u32>())),
        sigma in proptest::option::of(any_f64()),
        rate in proptest::option::of(any_f64()),
        ids in proptest::collection::vec(any::<u64>(), 0..300),
        sorted in any::<bool>(),
        norms in proptest::collection::vec(any_f64(), 0..300),
    ) -> StepPayload {
        let mut ids = ids;
        if sorted {
            ids.sort_unstable();
            ids.dedup();
        }
        StepPayload { step, part, noise_multiplier: sigma, sampling_rate: rate, ids, norms }
    }
}

/// Every field as bits, so that NaNs compare equal to themselves.
type Bits = (
    u64,
    Option<(u32, u32)>,
    Option<u64>,
    Option<u64>,
    Vec<u64>,
    Vec<u64>,
);

fn bits(p: &StepPayload) -> Bits {
    (
        p.step,
        p.part,
        p.noise_multiplier.map(f64::to_bits),
        p.sampling_rate.map(f64::to_bits),
        p.ids.clone(),
        p.norms.iter().map(|x| x.to_bits()).collect(),
    )
}

proptest! {
    #[test]
    fn every_payload_round_trips_bit_for_bit(p in payloads()) {
        let bytes = p.encode();
        let q = StepPayload::decode(&bytes).unwrap();
        prop_assert_eq!(bits(&p), bits(&q));
        // Deterministic encoding.
        prop_assert_eq!(q.encode(), bytes);
    }

    #[test]
    fn any_single_bit_flip_is_detected(p in payloads(), at in any::<prop::sample::Index>(), bit in 0..8u8) {
        let mut bytes = p.encode();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(StepPayload::decode(&bytes).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = StepPayload::decode(&bytes);
        let mut with_magic = b"DPLS\x01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = StepPayload::decode(&with_magic);
    }
}
