"""Main loops held to references that share torch and numpy with the scripts, never a script's class or piece,
where tests/test_main_loops.py leaves a path out: FedPake's --ablate (Table 4), whose random Micro- and
Macro-Classes main() draws each round from two seeds of (seed, round), run end to end here against the
reconstruction written out in test_main_loops (fedpake_server) fed the same draws, made here from
SeedSequence([seed, round, 0, tag]) (tag 7 the Micro-Classes, 8 the Macro-Classes). The statistics FedPake
logs (|H| / D, the number of Macro-Classes) and the global model must be the reference's, and round 1's draws
must give round 2 another model (else a draw made once could pass for a fresh one)."""
import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

import fedpake
from test_main_loops import (accuracy, assert_model, assert_rows, evaluated, fedpake_server, minibatches, run,
                             sampled, seed_of, setup, train_plain)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def drawn_classes(args, round_, ablate):
    """--ablate's draws for ``round_``, as fedpake_server takes them: the Micro-Classes uniform in [0, n_micro) per
    client and column of H, column by column (|H| x K drawn, read as K x |H|), from the tag-7 generator; each client
    in a uniform one of min(n_macro, K) Macro-Classes from the tag-8 generator, the empty ones dropped."""
    def generator(tag):
        return torch.Generator().manual_seed(seed_of(args.seed, round_, 0, tag))

    def micro(num_high, K):
        drawn = torch.randint(args.n_micro, (num_high, K), generator=generator(7), dtype=torch.uint8)
        return drawn.T.numpy().astype(int)

    def macro(K):
        draw = torch.randint(min(args.n_macro, K), (K,), generator=generator(8)).tolist()
        return [[k for k in range(K) if draw[k] == c] for c in sorted(set(draw))]

    return micro if "micro" in ablate else None, macro if "macro" in ablate else None


@pytest.mark.parametrize("ablate", [["micro"], ["macro"], ["micro", "macro"]], ids=["micro", "macro", "both"])
def test_fedpake_main_draws_table_4_s_random_classes_afresh_each_round_and_logs_their_statistics(ablate, tmp_path):
    flags = ["--ablate", *ablate, "--n-macro", "2"]  # 3 clients a round in at most 2 Macro-Classes: one holds two
    rows, checkpoint = run("fedpake.py", flags, tmp_path)
    args, data, model, rng = setup(fedpake, flags)
    global_, expected = parameters_to_vector(model.parameters()).detach().clone(), []
    for round_ in (1, 2):
        clients = sampled(rng, args.num_clients, args.join_ratio)
        trained, losses = [], []
        for c in clients:
            flat, loss = train_plain(model, global_, data, data.train_idx[c],
                                     minibatches(data.train_idx[c], args.batch_size, args.local_epochs,
                                                 seed_of(args.seed, round_, c)), args.lr)
            trained.append(flat), losses.append(loss)
        num_samples = [len(data.train_idx[c]) for c in clients]
        draws = drawn_classes(args, round_, ablate)
        global_, high_fraction, macro = fedpake_server(trained, num_samples, args.kappa, args.n_micro, args.n_macro,
                                                       args.delta, *draws)
        assert 0 < high_fraction < 1
        if round_ == 2:  # round 1's draws would give another model: a draw made once is told from a fresh one
            stale, _, _ = fedpake_server(trained, num_samples, args.kappa, args.n_micro, args.n_macro, args.delta,
                                         *drawn_classes(args, 1, ablate))
            assert (stale - global_).abs().max() > 1e-4
        expected.append({**accuracy([evaluated(model, global_, data, c) for c in range(args.num_clients)]),
                         "train_loss": sum(losses) / len(losses), "high_fraction": high_fraction,
                         "macro_classes": macro})
    assert_rows(rows, expected)
    assert_model(checkpoint["state"]["global_model"], global_)
