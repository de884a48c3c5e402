"""pytorch/examples reinforcement_learning/reinforce.py: policy gradient on CartPole
(stubs/gymnasium), no DataLoader: episodes of env steps, a per-model list of saved
log-probs, one backward per episode, module-level env/model/optimizer."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".", "gymnasium")
    install_probe(root, "reinforce.py")
    edit(root, "reinforce.py", ("for i_episode in count(1):", "for i_episode in range(1, 7):"))
