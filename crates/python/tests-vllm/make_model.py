"""Builds a tiny Llama (random weights, fixed seed) and its own byte-level BPE tokenizer from a
config in this folder, so the vLLM test downloads no model.

    python make_model.py models/tiny.json OUT_DIR

The tokenizer is trained on ``models/corpus.txt`` (260 tokens: 4 specials and the 256 bytes,
so any text encodes); training and initialisation are deterministic, and the output folder is
what ``LLM(model=OUT_DIR)`` loads. vLLM's CPU attention needs head_dim >= 32 (hidden_size /
num_attention_heads).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(HERE / "models" / "corpus.txt")], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def make_model(config_path: Path, out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads(config_path.read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    if head_dim < 32:
        raise SystemExit(
            f"{config_path}: head_dim {head_dim} < 32; vLLM's CPU attention supports 32, 64, "
            "80, ... (raise hidden_size or lower num_attention_heads)"
        )
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(cfg["vocab_size"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_model.py CONFIG.json OUT_DIR")
    print(make_model(Path(sys.argv[1]), Path(sys.argv[2])))
