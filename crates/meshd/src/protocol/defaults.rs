//! What an absent field of a request or answer means, and when a field is left out of the JSON (so that older peers read it unchanged).

/// What an absent `parts` means: one part.
pub fn one_part() -> u32 {
    1
}

/// Whether `parts` says nothing beyond the default (left out of the JSON, which then reads as before).
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
pub fn is_one_part(parts: &u32) -> bool {
    *parts <= 1
}

/// Whether a count is exactly 1 (left out of the JSON, which then reads as before the field; a 0 is
/// sent, for meshd to refuse).
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
pub fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Whether a count is 0 (left out of the JSON, which then reads as before the field).
#[allow(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
pub fn is_zero(n: &u32) -> bool {
    *n == 0
}
