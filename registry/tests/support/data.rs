//! Deterministic test data.

/// `n` values in `[lo, hi)` from a linear congruential generator seeded with `seed`.
pub fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * (hi - lo) + lo
        })
        .collect()
}
