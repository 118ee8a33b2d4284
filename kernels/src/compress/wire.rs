//! How a range of values travels between ranks: the bytes the GPU codec (`compress.cu`)
//! writes and reads, and the same bytes made on the CPU from [`Format::quantize`], so the
//! kernels can be checked byte for byte.
//!
//! A wire of `values` values in blocks of `block` holds, in order: one 4-byte word per block
//! (the block's f32 scale, or [`EXACT_WORD`] where the block travels exact), then one code
//! byte per value, then the exact area: 4 bytes per value, where only the blocks that travel
//! exact have their f32 values written, each at its own index. So the bytes that matter, and
//! the only ones that cross the bus when a wire lies in mapped host memory, are the words,
//! the codes and the exact blocks: 1 + 4/block bytes a value for scaled blocks.

use super::block::Encoded;
use super::format::{BlockSize, Format};

/// The scale word of a block that travels exact: a NaN, which no scaled block's scale is (a
/// scale is a finite largest magnitude over 127 or 448).
pub const EXACT_WORD: u32 = u32::MAX;

/// Where the parts of one wire lie, from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLayout {
    /// Values on the wire.
    pub values: usize,
    /// Values per block.
    pub block: BlockSize,
}

impl WireLayout {
    /// Blocks on the wire (the last may be short).
    pub fn blocks(self) -> usize {
        self.values.div_ceil(self.block.get())
    }

    /// Offset of the codes, one byte per value: after the words, on 16 bytes.
    pub fn codes_offset(self) -> usize {
        (4 * self.blocks()).next_multiple_of(16)
    }

    /// Offset of the exact area, 4 bytes per value: after the codes, on 16 bytes.
    pub fn exact_offset(self) -> usize {
        (self.codes_offset() + self.values).next_multiple_of(16)
    }

    /// Bytes the whole wire takes (its room, exact area included).
    pub fn bytes(self) -> usize {
        self.exact_offset() + 4 * self.values
    }

    /// Bytes that travel when every block is scaled: the words and the codes.
    pub fn scaled_bytes(self) -> usize {
        4 * self.blocks() + self.values
    }
}

/// `values` as a wire in `format` (every byte the GPU's encode writes, and zeros where it
/// writes nothing).
pub fn encode_wire(format: Format, block: BlockSize, values: &[f32]) -> Vec<u8> {
    let layout = WireLayout { values: values.len(), block };
    let mut wire = vec![0u8; layout.bytes()];
    for (b, chunk) in values.chunks(block.get()).enumerate() {
        let start = b * block.get();
        let word = match format.quantize(chunk) {
            Encoded::Scaled { scale, codes, .. } => {
                let at = layout.codes_offset() + start;
                wire[at..at + codes.len()].copy_from_slice(&codes);
                scale.to_bits()
            }
            Encoded::Exact(exact) => {
                for (i, v) in exact.iter().enumerate() {
                    let at = layout.exact_offset() + 4 * (start + i);
                    wire[at..at + 4].copy_from_slice(&v.to_ne_bytes());
                }
                EXACT_WORD
            }
        };
        wire[4 * b..4 * b + 4].copy_from_slice(&word.to_ne_bytes());
    }
    wire
}

/// The blocks of a wire of `values` values, as [`Encoded`] (what [`encode_wire`] was given,
/// block by block).
pub fn decode_wire(format: Format, block: BlockSize, values: usize, wire: &[u8]) -> Vec<Encoded> {
    let layout = WireLayout { values, block };
    let word = |at: usize| u32::from_ne_bytes([wire[at], wire[at + 1], wire[at + 2], wire[at + 3]]);
    (0..layout.blocks())
        .map(|b| {
            let range = b * block.get()..((b + 1) * block.get()).min(values);
            match word(4 * b) {
                EXACT_WORD => {
                    Encoded::Exact(range.map(|i| f32::from_bits(word(layout.exact_offset() + 4 * i))).collect())
                }
                scale => Encoded::Scaled {
                    format,
                    scale: f32::from_bits(scale),
                    codes: wire[layout.codes_offset() + range.start..layout.codes_offset() + range.end].to_vec(),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_puts_words_codes_and_exact_values_apart_on_16_bytes() {
        let layout = WireLayout { values: 100, block: BlockSize::new(32).unwrap() };
        assert_eq!(layout.blocks(), 4);
        assert_eq!((layout.codes_offset(), layout.exact_offset(), layout.bytes()), (16, 128, 528));
        assert_eq!(layout.scaled_bytes(), 116, "1 + 4/32 bytes a value");
        let empty = WireLayout { values: 0, block: BlockSize::new(256).unwrap() };
        assert_eq!((empty.blocks(), empty.bytes()), (0, 0));
    }

    #[test]
    fn a_wire_holds_what_quantize_makes_block_by_block() {
        let block = BlockSize::new(32).unwrap();
        // Block 0 scaled, block 1 holds an infinity (exact), block 2 is short and tiny (exact),
        // block 3 zeros.
        let mut values: Vec<f32> = (0..32).map(|i| i as f32 - 10.5).collect();
        values.extend((0..32).map(|i| if i == 7 { f32::INFINITY } else { i as f32 }));
        values.extend([1e-35f32; 32]);
        values.extend([0.0f32; 5]);
        for format in Format::ALL {
            let wire = encode_wire(format, block, &values);
            let blocks = decode_wire(format, block, values.len(), &wire);
            let want: Vec<Encoded> = values.chunks(32).map(|c| format.quantize(c)).collect();
            assert_eq!(blocks, want, "{format}");
            assert!(blocks[1].is_exact() && blocks[2].is_exact() && !blocks[3].is_exact());
            let layout = WireLayout { values: values.len(), block };
            assert_eq!(u32::from_ne_bytes(wire[4..8].try_into().unwrap()), EXACT_WORD);
            // Scaled blocks leave their exact room untouched, exact blocks their codes.
            assert!(wire[layout.exact_offset()..layout.exact_offset() + 128].iter().all(|&b| b == 0));
            assert!(wire[layout.codes_offset() + 32..layout.codes_offset() + 64].iter().all(|&b| b == 0));
        }
    }
}
