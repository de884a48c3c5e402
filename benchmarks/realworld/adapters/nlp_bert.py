"""graykode/nlp-tutorial 5-2.BERT: a BERT masked-LM + next-sentence toy, no DataLoader
(one batch drawn with the unseeded `random` module, reused every step), decoder weight
tied to the token embedding, vocabulary built from a set (hash order: the harness fixes
PYTHONHASHSEED), a prediction through the model after training."""
from adapters.common import edit, install_probe


def adapt(root):
    install_probe(root, "BERT.py")
    edit(root, "BERT.py",
         ("n_layers = 6 #", "n_layers = 2 #"), ("n_heads = 12 #", "n_heads = 4 #"),
         ("d_model = 768 #", "d_model = 64 #"), ("d_ff = 768 * 4", "d_ff = 64 * 4"),
         ("d_k = d_v = 64", "d_k = d_v = 16"), ("for epoch in range(100):", "for epoch in range(20):"))
