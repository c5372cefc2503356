"""An agent and its observers, after pytorch/examples' distributed/rpc/rl (REINFORCE), on CPU.

Rank 0 is the agent: it holds the policy. Every other rank is an observer with a small
simulated environment of its own (a cart to keep near the middle of a track; no gym needed).
Each episode the agent asks every observer, at once, to run one; an observer asks the agent
for each action over RPC (through an RRef to the agent) and reports each reward. Then the
agent takes one policy-gradient step over all observers' episodes.

    python -m tensorplay_rpc.run --nproc 3 examples/rl_observers.py [--backend torch]

Rank 0 prints a last line ``RESULT {...}`` (the rewards of each episode and the final policy
weights), the same on either backend: each observer's actions are drawn from a generator of
its own, so the order in which the calls interleave changes nothing.
"""

import argparse
import json
import os

import torch
from torch import nn

EPISODES = 5
STEPS = 20
GAMMA = 0.9


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    return parser.parse_args()


# The one line that differs from torch's example: which RPC to use.
if parse_args().backend == "torch":
    import torch.distributed.rpc as rpc
else:
    import tensorplay_rpc as rpc


class Cart:
    """A cart on a track from -2 to 2: push left (0) or right (1); the reward is higher the
    nearer the middle, and the episode ends if the cart leaves the track."""

    def __init__(self, seed):
        self.generator = torch.Generator().manual_seed(seed)

    def reset(self):
        self.x, self.v = (torch.rand(2, generator=self.generator, dtype=torch.float64) - 0.5).tolist()
        return self.state()

    def state(self):
        return torch.tensor([self.x, self.v], dtype=torch.float64)

    def step(self, action):
        self.v += 0.05 if action == 1 else -0.05
        self.x += self.v
        done = abs(self.x) > 2
        return self.state(), 1.0 - abs(self.x) / 2, done


class Observer:
    """Runs episodes of its own cart, asking the agent for every action."""

    def __init__(self, observer_id):
        self.id = observer_id
        self.cart = Cart(seed=observer_id)

    def run_episode(self, agent_rref, steps):
        state = self.cart.reset()
        for _ in range(steps):
            action = agent_rref.rpc_sync().select_action(self.id, state)
            state, reward, done = self.cart.step(action)
            agent_rref.rpc_sync().report_reward(self.id, reward)
            if done:
                break


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2)).double()

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


class Agent:
    """Holds the policy; remembers each observer's log-probabilities and rewards."""

    def __init__(self, world_size):
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=0.02)
        self.observers = {}
        self.generators = {}
        for rank in range(1, world_size):
            self.observers[rank] = rpc.remote(f"w{rank}", Observer, args=(rank,))
            self.generators[rank] = torch.Generator().manual_seed(100 + rank)
        self.log_probs = {rank: [] for rank in self.observers}
        self.rewards = {rank: [] for rank in self.observers}

    def select_action(self, observer_id, state):
        probs = self.policy(state)
        action = torch.multinomial(probs, 1, generator=self.generators[observer_id]).item()
        self.log_probs[observer_id].append(torch.log(probs[action]))
        return action

    def report_reward(self, observer_id, reward):
        self.rewards[observer_id].append(reward)

    def run_episode(self, agent_rref):
        futs = [
            rpc.rpc_async(ob.owner(), _run_observer_episode, args=(ob, agent_rref, STEPS))
            for ob in self.observers.values()
        ]
        for fut in futs:
            fut.wait()

    def finish_episode(self):
        """One REINFORCE step over every observer's episode, in observer order; the total
        reward of the episode."""
        losses, total = [], 0.0
        for rank in sorted(self.observers):
            returns, r = [], 0.0
            for reward in reversed(self.rewards[rank]):
                r = reward + GAMMA * r
                returns.insert(0, r)
            total += sum(self.rewards[rank])
            returns = torch.tensor(returns, dtype=torch.float64)
            returns = (returns - returns.mean()) / (returns.std() + 1e-9) if len(returns) > 1 else returns
            losses += [-lp * ret for lp, ret in zip(self.log_probs[rank], returns)]
            self.log_probs[rank], self.rewards[rank] = [], []
        self.optimizer.zero_grad()
        torch.stack(losses).sum().backward()
        self.optimizer.step()
        return round(total, 9)


def _run_observer_episode(ob_rref, agent_rref, steps):
    return ob_rref.local_value().run_episode(agent_rref, steps)


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    if rank == 0:
        agent = Agent(world_size)
        agent_rref = rpc.RRef(agent)
        rewards = []
        for _ in range(EPISODES):
            agent.run_episode(agent_rref)
            rewards.append(agent.finish_episode())
        weights = [round(v, 9) for v in torch.cat([p.detach().flatten() for p in agent.policy.parameters()])[:8].tolist()]
    rpc.shutdown()
    if rank == 0:
        print("RESULT " + json.dumps({"episode_rewards": rewards, "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
