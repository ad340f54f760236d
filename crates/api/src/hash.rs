//! The name hash that upstream puts in label values.
//!
//! Label values are limited to 63 characters, object names are not, so upstream labels pods,
//! services, PVCs and pool members with a short hash of a name instead of the name itself
//! (`agents.x-k8s.io/sandbox-name-hash`, `warm-pool-sandbox`, `sandbox-template-ref-hash`). Our
//! controller must produce the same values so that objects written by either implementation
//! select each other.

const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a (32 bit) of the UTF-8 bytes of `name`, as 8 lowercase hex digits.
///
/// ```
/// assert_eq!(agent_sandbox_api::name_hash("my-sandbox"), "374de8f5");
/// ```
pub fn name_hash(name: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnv1a_32(name.as_bytes());
    // Hand-rolled rather than `format!("{hash:08x}")`: this runs for every object the controller
    // and router index, and the formatting machinery costs several times the hash itself.
    (0..8)
        .rev()
        .map(|nibble| char::from(HEX[((hash >> (nibble * 4)) & 0xf) as usize]))
        .collect()
}

/// The raw FNV-1a 32-bit hash of `bytes`.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_upstream_vectors() {
        assert_eq!(name_hash("my-sandbox"), "374de8f5");
        assert_eq!(name_hash(""), "811c9dc5");
    }

    #[test]
    fn matches_published_fnv1a_vectors() {
        // Reference values of the FNV-1a 32-bit test suite.
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn is_always_eight_lowercase_hex_digits() {
        for name in [
            "",
            "a",
            "python-sandbox-pool",
            "x".repeat(300).as_str(),
            "ünïcödé",
        ] {
            let hash = name_hash(name);
            assert_eq!(hash.len(), 8, "{name:?} -> {hash}");
            assert!(
                hash.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            );
        }
    }
}
