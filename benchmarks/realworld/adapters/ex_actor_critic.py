"""pytorch/examples reinforcement_learning/actor_critic.py: policy gradient on CartPole
(stubs/gymnasium), no DataLoader: episodes of env steps, a per-model list of saved
log-probs, one backward per episode, module-level env/model/optimizer."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".", "gymnasium")
    install_probe(root, "actor_critic.py")
    edit(root, "actor_critic.py", ("for i_episode in count(1):", "for i_episode in range(1, 7):"))
