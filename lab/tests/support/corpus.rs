//! A small corpus for training tests.

use coupled_qk_lab::data::{TokenIds, TokenStream, TokenizedCorpus};
use std::sync::Arc;

/// About 12 KB of repetitive English, split 90/10 into train and validation, as bytes.
pub fn corpus() -> TokenizedCorpus {
    let subjects = [
        "The cat",
        "A dog",
        "The old man",
        "My sister",
        "The small bird",
        "Our teacher",
    ];
    let verbs = ["sees", "likes", "finds", "follows", "watches", "remembers"];
    let objects = [
        "the red ball",
        "a quiet river",
        "the green hill",
        "an open door",
        "the long road",
    ];
    let endings = [
        "in the morning.",
        "at night.",
        "after the rain.",
        "every day.",
        "near the house.",
    ];
    let mut text = String::new();
    let mut state = 12345u64;
    let mut pick = |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize % n
    };
    while text.len() < 12_000 {
        text.push_str(&format!(
            "{} {} {} {} ",
            subjects[pick(subjects.len())],
            verbs[pick(verbs.len())],
            objects[pick(objects.len())],
            endings[pick(endings.len())]
        ));
        if pick(4) == 0 {
            text.push('\n');
        }
    }
    bytes_corpus("test-english", &text)
}

/// `text` as a byte-tokenised corpus named `name`, split 90/10 into train and validation.
pub fn bytes_corpus(name: &str, text: &str) -> TokenizedCorpus {
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    let split = bytes.len() * 9 / 10;
    let byte_lens = Arc::new(vec![1u32; 256]);
    let stream = |ids: &[u32]| TokenStream {
        ids: TokenIds::from_u32(ids.to_vec(), 256),
        byte_lens: byte_lens.clone(),
    };
    TokenizedCorpus {
        name: name.into(),
        tokenizer: "bytes".into(),
        vocab_size: 256,
        train: stream(&bytes[..split]),
        valid: stream(&bytes[split..]),
    }
}
