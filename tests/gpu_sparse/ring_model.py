#!/usr/bin/env python3
"""Model of the K/V ring protocol of stages 15 and 16 (cuda/15_block_sparse.cu, RING OWNERSHIP),
run under random schedules: the producer's K/V warp and Q warp, two consumer warpgroups with
their ping-pong turns, mbarriers with parity waits, TMA copies that land at random later times.
Each trial draws items (two tiles with counts 0..6, identical lists or not) and checks that
  - nothing deadlocks (a step bound),
  - a consumer always finds, in the slot it computed from pk(j) / pv(j), the tile it wants,
  - the producer never overwrites a slot an owner still reads,
  - the turns end balanced.
It also checks that the model can fail: with 2 slots the protocol deadlocks and must be caught.
Seed: $SA_SEED or fresh, printed on failure. Exit 0 on success."""
import os, random, sys, time

class MBar:
    def __init__(s, count): s.count=count; s.pending=0; s.tx=0; s.phase=0
    def arrive(s, n=1):
        s.pending += n; s._maybe()
    def expect(s, nbytes): s.tx += nbytes; s.arrive()
    def complete_tx(s, nbytes): s.tx -= nbytes; s._maybe()
    def _maybe(s):
        assert s.pending <= s.count, "too many arrivals"
        if s.pending == s.count and s.tx == 0:
            s.pending = 0; s.phase += 1
    def done(s, parity): return (s.phase & 1) != parity

class Sim:
    def __init__(s, items, seed, nslot):
        s.nslot = nslot
        s.rng = random.Random(seed); s.items = items
        s.ready=[MBar(1) for _ in range(nslot)]
        s.free=[[MBar(4),MBar(4)] for _ in range(nslot)]
        s.q_ready=[MBar(1),MBar(1)]; s.q_free=[MBar(4),MBar(4)]
        s.turn=[0,0]; s.slot=[None]*nslot; s.qslot=[None,None]; s.inflight=[]; s.readers={}
    def tma(s, bar, arr, idx, content, kind):
        key=(kind, idx)
        assert not s.readers.get(key), \
            f"overwrite of {key} while {s.readers.get(key)} read {arr[idx]}"
        arr[idx] = ('pending', content); s.inflight.append((bar, arr, idx, content))

def plan(item):
    c0, c1, shared = item
    shared = shared and c0 == c1 and c0 > 0
    m = 0 if shared else min(c0, c1)
    loads = c0 if shared else c0 + c1
    return c0, c1, shared, m, loads

def producer_kv(S):
    NSLOT = S.nslot
    own = [0]*NSLOT; par = [[1,1] for _ in range(NSLOT)]
    p = 0
    for it, item in enumerate(S.items):
        c0, c1, shared, m, loads = plan(item)
        count1 = 0 if shared else c1
        own0 = 3 if shared else 1
        for j in range(max(c0, c1)):
            has0 = j < c0; has1 = j < count1
            for q in range(4):
                tile1 = q & 1; isv = q >> 1
                if not (has1 if tile1 else has0): continue
                owners = 2 if tile1 else own0
                s = p % NSLOT
                for c in range(2):
                    if own[s] & (1<<c):
                        while not S.free[s][c].done(par[s][c]): yield
                own[s] = owners
                for c in range(2):
                    if owners & (1<<c): par[s][c] ^= 1
                S.ready[s].expect(1)
                S.tma(S.ready[s], S.slot, s, (it, 'v' if isv else 'k', j, tile1 if not shared else 'sh', p), 'kv')
                S.readers[('kv', s)] = set(c for c in range(2) if owners & (1<<c))
                p += 1
                yield

def producer_q(S):
    qpar=[0,0]
    for it, item in enumerate(S.items):
        for c in range(2):
            if item[c] == 0: continue
            while not S.q_free[c].done(qpar[c]^1): yield
            S.q_ready[c].expect(1)
            S.tma(S.q_ready[c], S.qslot, c, (it, c), 'q'+str(c))
            S.readers[('q'+str(c), c)] = {c}
            qpar[c] ^= 1
            yield

def consumer(S, c):
    NSLOT = S.nslot
    def turn_wait():
        while S.turn[c] == 0: yield
        S.turn[c] -= 1
    def turn_pass():
        S.turn[1-c] += 1; assert S.turn[1-c] <= 1
    def wait(bar, parity):
        while not bar.done(parity): yield
    def read(pos, kind, j):
        s = pos % NSLOT
        v = S.slot[s]
        assert v[0] == 'done' and v[1][4] == pos and v[1][1] == kind and v[1][2] == j, f"c{c} wants {kind}{j}@{pos} slot {s}: {v}"
    if c == 1: turn_pass()
    base = 0; q_uses = 0
    for it, item in enumerate(S.items):
        c0, c1, shared, m, loads = plan(item)
        count = item[c]; other = item[1-c]
        my_turns = 1 + 2*count if count else 0
        item_turns = max(my_turns, 1 + 2*other if other else 0)
        if count > 0:
            yield from wait(S.q_ready[c], q_uses & 1); q_uses += 1
            pk = lambda j: 2*base + (4*j + c if j < m else 4*m + 2*(j - m))
            pv = lambda j: pk(j) + (2 if j < m else 1)
            P = pk(0)
            yield from wait(S.ready[P % NSLOT], (P // NSLOT) & 1)
            yield from turn_wait(); read(P, 'k', 0); turn_pass(); yield
            for j in range(count):
                K = pk(j); V = pv(j); Kn = pk(j+1)
                yield from wait(S.ready[V % NSLOT], (V // NSLOT) & 1)
                yield from turn_wait(); read(V, 'v', j); read(K, 'k', j); turn_pass(); yield
                S.readers[('kv', K % NSLOT)].discard(c); S.free[K % NSLOT][c].arrive(4)
                if j == count - 1:
                    S.readers[('q'+str(c), c)].discard(c); S.q_free[c].arrive(4)
                yield
                if j + 1 < count:
                    yield from wait(S.ready[Kn % NSLOT], (Kn // NSLOT) & 1)
                    yield from turn_wait(); read(V, 'v', j); read(Kn, 'k', j+1); turn_pass(); yield
                else:
                    yield from turn_wait(); read(V, 'v', j); turn_pass(); yield
                S.readers[('kv', V % NSLOT)].discard(c); S.free[V % NSLOT][c].arrive(4)
                yield
        for _ in range(item_turns - my_turns):
            yield from turn_wait(); turn_pass(); yield
        base += loads
    if c == 0:
        yield from turn_wait()

def run(items, seed, maxsteps, nslot):
    S = Sim(items, seed, nslot)
    live = {'pkv': producer_kv(S), 'pq': producer_q(S), 'c0': consumer(S,0), 'c1': consumer(S,1)}
    steps = 0
    while live or S.inflight:
        steps += 1
        if steps > maxsteps: raise RuntimeError("too many steps (deadlock?)")
        choices = list(live.keys()) + (['tma'] if S.inflight else [])
        who = S.rng.choice(choices)
        if who == 'tma':
            i = S.rng.randrange(len(S.inflight))
            bar, arr, idx, content = S.inflight.pop(i)
            arr[idx] = ('done', content); bar.complete_tx(1); continue
        try: next(live[who])
        except StopIteration: del live[who]
    assert S.turn == [0,0]


def trial_items(rng):
    items = []
    for _ in range(rng.randint(1, 6)):
        a = rng.randint(0, 6); b = rng.randint(0, 6)
        if rng.random() < 0.3: items.append((a, a, True))
        else: items.append((a, b, False))
    return items

def main():
    seed = int(os.environ.get('SA_SEED', '0')) or (time.time_ns() ^ os.getpid())
    rng = random.Random(seed)
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for t in range(trials):
        items = trial_items(rng)
        try:
            run(items, rng.getrandbits(32), 300000, 5)
        except (AssertionError, RuntimeError) as e:
            print(f"FAIL: 5 slots, items {items}: {e!r} (seed {seed})")
            return 1
    # The checker must be able to fail: two slots hold one block's K and V, which deadlocks.
    caught = 0
    for t in range(20):
        try:
            run([(4, 4, False), (3, 5, False)], rng.getrandbits(32), 50000, 2)
        except (AssertionError, RuntimeError):
            caught += 1
    if not caught:
        print(f"FAIL: the 2-slot ring was never caught deadlocking (seed {seed})")
        return 1
    print(f"ok: {trials} random trials with 5 slots; 2 slots caught {caught}/20 (seed {seed})")
    return 0

if __name__ == '__main__':
    sys.exit(main())
