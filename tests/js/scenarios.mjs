// Drives a Turnstile server with the genuine Genkit client (genkit/beta/client, 1.42.0).
//
//   node scenarios.mjs <scenario> <baseUrl> [bearerToken]
//
// Prints one JSON object: what the client observed. The Python acceptance test
// (tests/acceptance/test_genkit_js_client.py) starts the server, runs a scenario and asserts
// on that object; nothing here decides whether the server behaved.
import { remoteAgent } from 'genkit/beta/client';

const [, , scenario, baseUrl, token] = process.argv;
const headers = token ? { Authorization: `Bearer ${token}` } : undefined;
const agent = (name) => remoteAgent({ url: `${baseUrl}/api/${name}`, headers });
const banking = () => agent('bankingAgent');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const texts = (snapshot) =>
  (snapshot?.state?.messages ?? []).map((m) => m.content.map((p) => p.text ?? '').join(''));
const interrupts = (res) => res.interrupts.map((i) => ({ name: i.name, ref: i.ref, input: i.input }));
const failure = (e) => ({
  error: true,
  name: e.name,
  status: e.status,
  message: String(e.message),
  snapshotId: e.snapshotId ?? null,
});
async function attempt(fn) {
  try {
    return await fn();
  } catch (e) {
    return failure(e);
  }
}

const scenarios = {
  async send() {
    const chat = banking().chat();
    const res = await chat.send('hello there');
    return { text: res.text, finishReason: res.finishReason, snapshotId: res.snapshotId, sessionId: res.sessionId };
  },

  async stream() {
    const chat = banking().chat();
    const turn = chat.sendStream('hello streaming world');
    const chunks = [];
    for await (const chunk of turn.stream) {
      if (chunk.text) chunks.push(chunk.text);
    }
    const res = await turn.response;
    return { chunks, text: res.text, finishReason: res.finishReason };
  },

  async respond() {
    const chat = banking().chat();
    const paused = await chat.send('transfer $40 to carol');
    const first = { finishReason: paused.finishReason, interrupts: interrupts(paused), snapshotId: paused.snapshotId };
    const [approval] = paused.interrupts;
    const turn = chat.resumeStream({ respond: [approval.respond({ approved: true, feedback: 'ok' })] });
    const chunks = [];
    for await (const chunk of turn.stream) chunks.push(chunk.raw);
    const done = await turn.response;
    return { first, text: done.text, finishReason: done.finishReason, snapshotId: done.snapshotId, chunks };
  },

  async restart() {
    const chat = banking().chat();
    const paused = await chat.send('transfer $15 to dave');
    const again = await chat.resume({ restart: [paused.interrupts[0].restart()] });
    const done = await chat.resume({ respond: [again.interrupts[0].respond({ approved: false, feedback: 'no' })] });
    return {
      first: interrupts(paused),
      again: { finishReason: again.finishReason, interrupts: interrupts(again) },
      text: done.text,
    };
  },

  async several() {
    const chat = banking().chat();
    const paused = await chat.send('transfer $10 to alice and $20 to bob');
    const partial = await attempt(() => chat.resume({ respond: [paused.interrupts[0].respond({ approved: true })] }));
    const done = await chat.resume({
      respond: paused.interrupts.map((i) => i.respond({ approved: true })),
    });
    return { interrupts: interrupts(paused), partial, text: done.text };
  },

  async forged() {
    const chat = banking().chat();
    const paused = await chat.send('transfer $99 to mallory');
    const wrongRef = await attempt(() =>
      chat.resume({ respond: [{ toolResponse: { name: 'userApproval', ref: 'approval-7', output: { approved: true } } }] }),
    );
    const wrongTool = await attempt(() =>
      chat.resume({ respond: [{ toolResponse: { name: 'transferMoney', ref: 'approval-1', output: { approved: true } } }] }),
    );
    const badOutput = await attempt(() =>
      chat.resume({ respond: [paused.interrupts[0].respond({ approved: 'yes please' })] }),
    );
    const pointsAt = chat.snapshotId;
    const done = await chat.resume({ respond: [paused.interrupts[0].respond({ approved: false })] });
    return { pausedAt: paused.snapshotId, wrongRef, wrongTool, badOutput, pointsAt, text: done.text };
  },

  async replay() {
    // Answering the same pause twice from two chats: one approval, one transfer.
    const api = banking();
    const chat = api.chat();
    const paused = await chat.send('transfer $5 to erin');
    const other = api.chat({ snapshotId: paused.snapshotId });
    const answer = paused.interrupts[0].respond({ approved: true });
    const first = await chat.resume({ respond: [answer] });
    const second = await attempt(() => other.resume({ respond: [answer] }));
    return { first: first.text, second };
  },

  async snapshots() {
    const api = banking();
    const chat = api.chat();
    const res = await chat.send('hello snapshots');
    const bySnapshot = await api.getSnapshot(res.snapshotId);
    const bySession = await api.getSnapshot({ sessionId: res.sessionId });
    const missing = await attempt(() => api.getSnapshot('does-not-exist'));
    return {
      snapshotId: res.snapshotId,
      bySnapshot: { snapshotId: bySnapshot.snapshotId, status: bySnapshot.status, messages: bySnapshot.state.messages.length },
      bySession: { snapshotId: bySession.snapshotId, status: bySession.status },
      missing,
    };
  },

  async detach() {
    const chat = banking().chat();
    const task = await chat.detach('slow hello from the background');
    const pending = chat.snapshotId;
    const statuses = [];
    let settled;
    for await (const snap of task.poll({ intervalMs: 100 })) {
      statuses.push(snap.status);
      settled = snap;
    }
    return { pending, taskId: task.snapshotId, statuses, last: settled.state.messages.at(-1) };
  },

  async abort() {
    const api = banking();
    const chat = api.chat();
    const task = await chat.detach('slow one two three four five six seven eight nine ten');
    await sleep(400);
    const aborted = await chat.abort();
    const settled = await task.wait({ intervalMs: 100 });
    const unknown = await attempt(() => api.abort('does-not-exist'));
    return { aborted, status: settled.status, unknown: unknown ?? null };
  },

  async stateless() {
    const chat = agent('bankingAgentStateless').chat();
    const paused = await chat.send('transfer $7 to frank');
    const state = paused.raw.state;
    const done = await chat.resume({ respond: [paused.interrupts[0].respond({ approved: true })] });
    // A client that edits its state blob (here: invents an approval request) is refused.
    const forgedState = JSON.parse(JSON.stringify(state));
    forgedState.messages.at(-1).content[0].toolRequest.input.details = 'Transfer $7000 to frank';
    const forged = agent('bankingAgentStateless').chat({ state: forgedState });
    const tampered = await attempt(() => forged.resume({ respond: [paused.interrupts[0].respond({ approved: true })] }));
    const noStore = await attempt(() => agent('bankingAgentStateless').chat().detach('hello'));
    return {
      paused: { finishReason: paused.finishReason, hasState: !!state, hasSnapshotId: paused.snapshotId !== undefined },
      text: done.text,
      tampered,
      noStore,
    };
  },

  async misuse() {
    const stateful = banking().chat({ state: { sessionId: 'x', messages: [] } });
    const sendState = await attempt(() => stateful.send('hi'));
    const stateless = agent('bankingAgentStateless').chat({ snapshotId: 'abc' });
    const sendSnapshot = await attempt(() => stateless.send('hi'));
    const unknownAgent = await attempt(() => agent('nobody').chat().send('hi'));
    return { sendState, sendSnapshot, unknownAgent };
  },

  async failure() {
    const chat = banking().chat();
    await chat.send('hello first');
    const failed = await attempt(() => chat.send('please fail now'));
    const pointsAt = chat.snapshotId;
    const next = await attempt(() => chat.send('hello again'));
    return { failed, pointsAt, next: { text: next.text, sessionId: next.sessionId } };
  },

  // Genkit's habit after a failure: go on from the last good snapshot (a new chat on it).
  async continueFromLastGood() {
    const api = banking();
    const first = await api.chat().send('hello first');
    const failed = await attempt(() => api.chat({ snapshotId: first.snapshotId }).send('please fail now'));
    const next = await attempt(() => api.chat({ snapshotId: first.snapshotId }).send('hello again'));
    const snapshot = next.snapshotId ? await api.getSnapshot(next.snapshotId) : undefined;
    return {
      first: { sessionId: first.sessionId, snapshotId: first.snapshotId },
      failed,
      next: { text: next.text ?? null, sessionId: next.sessionId ?? null, error: next.error ?? false },
      parentId: snapshot?.parentId ?? null,
      texts: texts(snapshot),
    };
  },

  // Genkit's spec, "snapshot branching across invocations": one snapshot continued twice.
  async branch() {
    const api = banking();
    const root = await api.chat().send('hello root');
    const a = await api.chat({ snapshotId: root.snapshotId }).send('hello a');
    const b = await api.chat({ snapshotId: root.snapshotId }).send('hello b');
    const seen = async (res) => {
      const snapshot = await api.getSnapshot(res.snapshotId);
      return { sessionId: res.sessionId, parentId: snapshot.parentId, status: snapshot.status, texts: texts(snapshot) };
    };
    const rootLatest = await api.getSnapshot({ sessionId: root.sessionId });
    return {
      root: { sessionId: root.sessionId, snapshotId: root.snapshotId },
      a: await seen(a),
      b: await seen(b),
      rootLatest: { snapshotId: rootLatest.snapshotId, texts: texts(rootLatest) },
    };
  },

  // Custom session state and artifacts (tests.acceptance.state_app).
  async customState() {
    const counter = agent('counterAgent');
    const chat = counter.chat();
    const turn = chat.sendStream('first');
    const chunks = [];
    const customs = [];
    for await (const chunk of turn.stream) {
      if (chunk.raw.customPatch || chunk.raw.artifact) chunks.push(chunk.raw);
      if (chunk.custom !== undefined) customs.push(chunk.custom);
    }
    const first = await turn.response;
    // The response's state getter reads the chat's live state: copy it before the next turn.
    const firstSeen = { state: first.state, artifacts: first.artifacts, raw: first.raw };
    const second = await chat.send('second');
    const snapshot = await counter.getSnapshot(second.snapshotId);
    const loaded = await counter.loadChat({ snapshotId: second.snapshotId });
    return {
      chunks,
      customs,
      first: firstSeen,
      second: { state: second.state, artifacts: second.artifacts, chatState: chat.state },
      chatArtifacts: chat.artifacts,
      snapshotState: { custom: snapshot.state.custom, artifacts: snapshot.state.artifacts },
      loaded: { state: loaded.state, artifacts: loaded.artifacts },
    };
  },

  async multiState() {
    const chat = agent('multiStateAgent').chat();
    const turn = chat.sendStream('go');
    const chunks = [];
    for await (const chunk of turn.stream) {
      if (chunk.raw.customPatch || chunk.raw.artifact) chunks.push({ raw: chunk.raw, custom: chunk.custom });
    }
    const res = await turn.response;
    return { chunks, state: res.state, artifacts: res.artifacts, text: res.text };
  },

  async bigState() {
    const chat = agent('bigStateAgent').chat();
    const turn = chat.sendStream('go');
    const patches = [];
    for await (const chunk of turn.stream) {
      if (chunk.raw.customPatch) patches.push(chunk.raw.customPatch.map((op) => ({ op: op.op, path: op.path })));
    }
    const res = await turn.response;
    return { patches, n: res.state.n, draftLength: res.state.draft.length, chatN: chat.state.n };
  },

  async clientState() {
    const stateless = agent('counterAgentStateless');
    const chat = stateless.chat();
    const first = await chat.send('first');
    const firstSeen = { state: first.state, raw: first.raw.state.custom };
    const second = await chat.send('second');
    const tampered = stateless.chat({
      state: { ...second.raw.state, custom: { counter: 1000 } },
    });
    const forged = await attempt(() => tampered.send('third'));
    return {
      first: firstSeen,
      second: { state: second.state, artifacts: second.artifacts, messages: second.raw.state.messages.length },
      forged,
    };
  },

  // A blob paused under v1 (baseUrl), kept by the client and sent back after deploys:
  // to v1 again, to a changed v2, to a v2 that registers a migration from v1.
  async pinnedState() {
    const at = (base) => remoteAgent({ url: `${base}/api/paymentsStateless`, headers });
    const chat = at(baseUrl).chat();
    const paused = await chat.send('move 5');
    const kept = JSON.parse(JSON.stringify(paused.raw.state));
    const answer = () => [paused.interrupts[0].respond({ approved: true })];
    // The same chat echoes its state back to the same deploy.
    const sameDeploy = await chat.resume({ respond: answer() });
    const refused = await attempt(() =>
      at(process.env.V2_URL).chat({ state: kept }).resume({ respond: answer() }),
    );
    const migrated = await at(process.env.V2_MIGRATING_URL)
      .chat({ state: kept })
      .resume({ respond: answer() });
    return {
      paused: { interrupts: interrupts(paused), pin: kept.pin },
      sameDeploy: { text: sameDeploy.text, pin: sameDeploy.raw.state.pin },
      refused: refused.error ? refused : { finishReason: refused.finishReason, error: refused.raw.error },
      migrated: { text: migrated.text, pin: migrated.raw.state.pin },
    };
  },
};

const run = scenarios[scenario];
if (!run) {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
const result = await run();
process.stdout.write(JSON.stringify(result) + '\n');
process.exit(0);
