// muarl report viewer: draws trajectories, groups and token overlays from the embedded JSON blob.
// Plain JavaScript, no libraries, no network. All data goes into the page through textContent
// (never innerHTML), so a trajectory's text cannot inject markup.
"use strict";

const PAGE = 50;
const GROUP_PAGE = 20;
const state = { data: null, filtered: [], page: 0, groupPage: 0, groupStep: "" };

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return el;
}

function num(v, digits = 3) {
  if (v === null || v === undefined) return "";
  if (typeof v !== "number") return String(v);
  return Number.isInteger(v) ? String(v) : v.toFixed(digits).replace(/0+$/, "").replace(/\.$/, "");
}

async function loadData() {
  const node = document.getElementById("muarl-data");
  const text = node.textContent;
  if (node.dataset.encoding === "gzip+base64") {
    const bytes = Uint8Array.from(atob(text.trim()), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }
  return JSON.parse(text);
}

function rewardBadge(t) {
  if (t.fault) return h("span", { class: "badge fault", title: t.fault.message }, "fault: " + t.fault.kind);
  if (!t.reward) return h("span", { class: "badge unscored" }, "unscored");
  const ok = t.reward.reward >= 1;
  return h("span", { class: "badge " + (ok ? "pass" : "fail") }, "reward " + num(t.reward.reward));
}

function advClass(a) {
  if (a === null || a === undefined || Math.abs(a) < 1e-9) return "adv-zero";
  return a > 0 ? "adv-pos" : "adv-neg";
}

// ---------- trajectory list ----------

function options(values) {
  return [h("option", { value: "" }, "all"), ...values.map((v) => h("option", { value: v }, v))];
}

function uniq(values) {
  return [...new Set(values.filter((v) => v !== null && v !== undefined && v !== ""))].sort();
}

function buildList(sec) {
  const trajs = state.data.trajectories;
  const f = {
    task: h("input", { id: "f-task", type: "search", placeholder: "task id or family" }),
    domain: h("select", { id: "f-domain" }, options(uniq(trajs.map((t) => t.domain)))),
    reward: h("select", { id: "f-reward" },
      h("option", { value: "" }, "all"), h("option", { value: "pass" }, "reward 1"),
      h("option", { value: "fail" }, "reward < 1"), h("option", { value: "unscored" }, "unscored")),
    stop: h("select", { id: "f-stop" }, options(uniq(trajs.map((t) => t.stop_reason)))),
    fault: h("select", { id: "f-fault" }, options(["none", ...uniq(trajs.map((t) => t.fault && t.fault.kind))])),
    source: h("select", { id: "f-source" }, options(uniq(trajs.map((t) => t.source)))),
  };
  const counter = h("span", { id: "list-count" });
  const bar = h("div", { class: "filters" },
    h("label", {}, "task ", f.task), h("label", {}, "domain ", f.domain), h("label", {}, "reward ", f.reward),
    h("label", {}, "stop reason ", f.stop), h("label", {}, "fault ", f.fault), h("label", {}, "file ", f.source),
    counter);
  const table = h("table", { class: "grid", id: "traj-table" });
  const pager = h("div", { class: "pager" });
  sec.append(bar, table, pager);
  const apply = () => {
    const q = f.task.value.trim().toLowerCase();
    state.filtered = trajs.filter((t) =>
      (!q || t.task_id.toLowerCase().includes(q) || (t.family || "").toLowerCase().includes(q)) &&
      (!f.domain.value || t.domain === f.domain.value) &&
      (!f.stop.value || t.stop_reason === f.stop.value) &&
      (!f.fault.value || (t.fault ? t.fault.kind : "none") === f.fault.value) &&
      (!f.source.value || t.source === f.source.value) &&
      (!f.reward.value || (f.reward.value === "unscored" ? !t.reward :
        t.reward && (f.reward.value === "pass") === (t.reward.reward >= 1))));
    state.page = 0;
    drawList(table, pager, counter);
  };
  for (const el of Object.values(f)) { el.addEventListener("input", apply); el.addEventListener("change", apply); }
  apply();
}

function drawList(table, pager, counter) {
  const rows = state.filtered;
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  const shown = rows.slice(state.page * PAGE, (state.page + 1) * PAGE);
  counter.textContent = `${rows.length} of ${state.data.trajectories.length}`;
  const cols = ["#", "task", "family", "domain", "file", "step", "member", "reward", "tcr", "turns", "stop reason",
    "violations", "advantage"];
  table.replaceChildren(
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c)))),
    h("tbody", {}, shown.map((t) => h("tr", { class: "traj-row", "data-index": t.i },
      h("td", {}, h("a", { href: `#traj/${t.i}`, class: "traj-link" }, String(t.i))),
      h("td", {}, h("a", { href: `#traj/${t.i}` }, t.task_id)), h("td", {}, t.family || ""), h("td", {}, t.domain),
      h("td", {}, t.source), h("td", {}, num(t.step)), h("td", {}, num(t.member)),
      h("td", {}, rewardBadge(t)), h("td", {}, t.reward ? num(t.reward.tcr) : ""), h("td", {}, num(t.turns)),
      h("td", {}, t.stop_reason), h("td", {}, t.reward ? String(t.reward.violations.length) : ""),
      h("td", { class: advClass(t.advantage) }, num(t.advantage))))));
  pager.replaceChildren(
    h("button", { disabled: state.page === 0, onclick: () => { state.page--; drawList(table, pager, counter); } }, "previous"),
    h("span", {}, ` page ${state.page + 1} of ${pages} `),
    h("button", { disabled: state.page >= pages - 1, onclick: () => { state.page++; drawList(table, pager, counter); } },
      "next"));
}

// ---------- one trajectory ----------

function laneCell(e) {
  const cls = `ev ev-${e.kind}` + (e.ok === false ? " ev-failed" : "");
  if (e.kind === "message") {
    // a user turn muarl.users.slips flagged: what the simulated user got wrong there, marked on the turn
    const slips = (e.slips || []).map((s) => h("span", { class: "badge slip", title: "the simulated user's slip" }, s));
    return h("div", { class: cls + (slips.length ? " ev-slip" : "") }, ...slips, h("div", { class: "text" }, e.text));
  }
  if (e.kind === "call") {
    return h("div", { class: cls }, h("span", { class: "tool-name" }, e.name), h("code", { class: "args" }, e.args));
  }
  const who = e.actor === "user" ? " (user's tool)" : "";
  return h("div", { class: cls },
    h("div", {}, h("span", { class: "tool-name" }, e.name), h("span", { class: "ok" }, e.ok ? " ok" : " failed"),
      who, e.error ? h("span", { class: "err" }, ` [${e.error}]`) : null),
    e.changed && e.changed.length ? h("div", { class: "changed" }, "changed: " + e.changed.join(", ")) : null,
    h("pre", { class: "output" }, e.text));
}

function swimlanes(t) {
  const grid = h("div", { class: "lanes", id: "lanes" },
    h("div", { class: "lane-head lane-agent" }, "agent"), h("div", { class: "lane-head lane-user" }, "user"),
    h("div", { class: "lane-head lane-tools" }, "tools"));
  const col = { agent: 1, user: 2, tools: 3 };
  t.events.forEach((e, n) => {
    const cell = laneCell(e);
    cell.classList.add("lane-" + e.lane);
    cell.style.gridColumn = String(col[e.lane]);
    cell.style.gridRow = String(n + 2);
    grid.appendChild(cell);
  });
  return grid;
}

function rewardPanel(t) {
  const r = t.reward;
  if (!r) return h("div", { class: "panel", id: "reward" }, h("h3", {}, "reward"), "not scored (its task is unknown here)");
  return h("div", { class: "panel", id: "reward" },
    h("h3", {}, "reward breakdown", t.scored_here ? " (scored by the viewer)" : ""),
    h("table", { class: "kv" },
      [["reward", num(r.reward)], ["db_match", String(r.db_match)], ["outputs_ok", String(r.outputs_ok)],
        ["outputs required", String(r.outputs_required)], ["tcr", num(r.tcr)], ["stop reason", t.stop_reason],
        ["turns", num(t.turns)], ["malformed calls", num(t.malformed_calls)], ["sim fault", String(t.sim_fault)]]
        .map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))),
    h("h4", {}, "checks"),
    h("ul", { class: "checks" }, r.checks.map((c) =>
      h("li", { class: c.passed ? "pass" : "fail" }, (c.passed ? "pass " : "FAIL ") + c.name, c.detail ? ` (${c.detail})` : ""))),
    h("h4", {}, "violations"),
    r.violations.length ? h("ul", { class: "violations" }, r.violations.map((v) =>
      h("li", {}, `${v.kind}: ${v.tool} (${v.detail})`))) : h("p", {}, "none"));
}

function faultPanel(t) {
  if (!t.fault) return null;
  return h("div", { class: "panel fault", id: "fault" },
    h("h3", {}, `fault: ${t.fault.kind}`),
    h("p", {}, "Not the agent's doing: this episode is left out of the success metrics and the gradient."),
    h("pre", { class: "output" }, t.fault.message),
    t.fault.traceback ? h("details", {}, h("summary", {}, "traceback"), h("pre", { class: "output" }, t.fault.traceback))
      : null);
}

function diffPanel(t) {
  const r = t.reward;
  const task = state.data.tasks[`${t.domain}/${t.task_id}`];
  return h("div", { class: "panel", id: "diff" },
    h("h3", {}, "database diff against gold"),
    !r ? h("p", {}, "unknown") : r.diff.length ? h("pre", { class: "diff" }, r.diff.join("\n"))
      : h("p", { class: "pass" }, "final database equals the gold database"),
    task ? h("div", {}, h("h4", {}, "gold actions"),
      task.gold.length ? h("pre", { class: "gold" }, task.gold.join("\n")) : h("p", {}, "none (no write expected)"),
      task.required_outputs.length ? h("p", {}, "required outputs: " + task.required_outputs.join(", ")) : null) : null);
}

function tokenOverlay(t, box) {
  const tok = t.tokens;
  const vocab = state.data.vocab;
  const hasVocab = Object.keys(vocab).length > 0;
  const prefix = tok.prefix >= 0 ? state.data.prefixes[tok.prefix] : [];
  const ids = prefix.concat(tok.ids);
  const mask = [];
  tok.mask.forEach((len, n) => { for (let k = 0; k < len; k++) mask.push(n % 2); });
  const trained = mask.reduce((a, b) => a + b, 0);
  let lp = 0;
  const sign = advClass(t.advantage);
  const span = (pos) => {
    const id = ids[pos];
    const m = mask[pos] || 0;
    const text = hasVocab ? (vocab[String(id)] ?? `<${id}>`) : `${id} `;
    const title = m ? `id ${id}, mask 1, logprob ${num(tok.logprobs[lp++])}` : `id ${id}, mask 0`;
    return h("span", { class: m ? "tk m1 " + sign : "tk m0", title }, text);
  };
  const frag = document.createDocumentFragment();
  let start = 0;
  if (prefix.length && !mask.slice(0, prefix.length).some((m) => m)) {
    start = prefix.length;
    const more = h("button", { class: "show-prefix" }, `show the shared prefix (${prefix.length} tokens, all mask 0)`);
    const holder = h("span", {}, more);
    more.addEventListener("click", () => {
      const inner = document.createDocumentFragment();
      for (let p = 0; p < prefix.length; p++) inner.appendChild(span(p));
      holder.replaceChildren(inner);
    });
    frag.appendChild(holder);
  }
  for (let p = start; p < ids.length; p++) frag.appendChild(span(p));
  box.replaceChildren(
    h("p", { class: "token-stats" }, `${ids.length} tokens, ${trained} with loss mask 1 (sampled by the agent)` +
      (t.advantage !== null && t.advantage !== undefined ? `, advantage ${num(t.advantage)}` : "") +
      (hasVocab ? `; decoded with ${state.data.tokenizer}` : "; no tokenizer: ids shown")),
    h("div", { class: "tokens", id: "token-overlay" }, frag));
}

function showTrajectory(i) {
  const t = state.data.trajectories[i];
  const sec = document.getElementById("sec-trajectory");
  if (!t) { sec.replaceChildren(h("p", {}, `no trajectory #${i}`)); return; }
  const task = state.data.tasks[`${t.domain}/${t.task_id}`];
  const nav = h("div", { class: "pager" },
    h("a", { href: "#trajectories" }, "back to the list"),
    i > 0 ? h("a", { href: `#traj/${i - 1}` }, "previous") : null,
    i + 1 < state.data.trajectories.length ? h("a", { href: `#traj/${i + 1}` }, "next") : null);
  const facts = [["domain", t.domain], ["family", t.family], ["file", t.source], ["step", num(t.step)],
    ["member", num(t.member)], ["advantage", num(t.advantage)], ["user seed", num(t.user_seed)],
    ...Object.entries(t.meta).filter(([k]) => !["member", "advantage", "step"].includes(k)).map(([k, v]) => [k, num(v)])];
  const tokenBox = h("div", { id: "tokens-box" });
  const children = [nav,
    h("h2", { id: "traj-title" }, `#${i} ${t.task_id} `, rewardBadge(t), h("span", { class: "badge stop" }, t.stop_reason)),
    h("table", { class: "kv facts" }, facts.filter(([, v]) => v !== "" && v !== null && v !== undefined)
      .map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, String(v))))),
    task ? h("details", { class: "instruction" }, h("summary", {}, "what the simulated user wants"), h("p", {}, task.instruction)) : null,
    t.system !== null ? h("details", {}, h("summary", {}, "system prompt (policy)"),
      h("pre", { class: "output" }, state.data.strings[t.system])) : null,
    faultPanel(t),
    h("div", { class: "panels" }, rewardPanel(t), diffPanel(t)),
    h("h3", {}, "conversation"), swimlanes(t)];
  if (t.tokens) {
    const btn = h("button", { id: "show-tokens" }, "show the loss-mask overlay on tokens");
    btn.addEventListener("click", () => { btn.remove(); tokenOverlay(t, tokenBox); });
    children.push(h("h3", {}, "tokens"), btn, tokenBox);
  }
  sec.replaceChildren(...children);
}

// ---------- groups side by side ----------

function buildGroups(sec) {
  const groups = state.data.groups;
  const steps = uniq(groups.map((g) => (g.step === null ? "" : String(g.step))));
  const pick = h("select", { id: "f-group-step" }, options(steps));
  const box = h("div", { id: "groups-box" });
  const pager = h("div", { class: "pager" });
  sec.append(h("div", { class: "filters" }, h("label", {}, "step ", pick)), box, pager);
  const draw = () => {
    const shown = groups.filter((g) => !pick.value || String(g.step) === pick.value);
    const pages = Math.max(1, Math.ceil(shown.length / GROUP_PAGE));
    box.replaceChildren(...shown.slice(state.groupPage * GROUP_PAGE, (state.groupPage + 1) * GROUP_PAGE).map(groupCard));
    pager.replaceChildren(
      h("button", { disabled: state.groupPage === 0, onclick: () => { state.groupPage--; draw(); } }, "previous"),
      h("span", {}, ` page ${state.groupPage + 1} of ${pages} `),
      h("button", { disabled: state.groupPage >= pages - 1, onclick: () => { state.groupPage++; draw(); } }, "next"));
  };
  pick.addEventListener("change", () => { state.groupPage = 0; draw(); });
  draw();
}

function groupCard(g) {
  const trajs = state.data.trajectories;
  return h("div", { class: "group" },
    h("h3", {}, `${g.task_id} `, g.step !== null ? `step ${g.step} ` : "", h("small", {}, `${g.source}; advantages ${g.advantage_source}`)),
    h("div", { class: "members" }, g.members.map((i, n) => {
      const t = trajs[i];
      const adv = g.advantages[n];
      const lastAgent = [...t.events].reverse().find((e) => e.lane === "agent");
      const trained = t.tokens ? t.tokens.mask.filter((_, k) => k % 2).reduce((a, b) => a + b, 0) : null;
      return h("div", { class: "member " + advClass(adv).replace("adv", "edge") },
        h("div", {}, h("a", { href: `#traj/${i}` }, `member ${num(t.member)}`), " ", rewardBadge(t)),
        h("div", { class: "adv" }, `advantage ${num(adv)}`,
          t.meta.trained === false ? h("span", { class: "untrained" }, " (not in the update)") : null),
        h("div", {}, `${t.stop_reason}, ${t.turns} turns` + (trained !== null ? `, ${trained} agent tokens` : "")),
        h("div", {}, "tools: " + (t.events.filter((e) => e.lane === "agent" && e.kind === "call").map((e) => e.name).join(", ") || "none")),
        lastAgent ? h("div", { class: "snippet" }, (lastAgent.text || lastAgent.name || "").slice(0, 240)) : null,
        h("details", {}, h("summary", {}, "conversation"), h("div", { class: "compact" }, t.events.map((e) =>
          h("div", { class: "lane-" + e.lane }, h("b", {}, e.lane + ": "),
            e.kind === "call" ? `${e.name}(${e.args})` : (e.text || "").slice(0, 400))))));
    })));
}

// ---------- routing ----------

const built = {};

function route() {
  const hash = location.hash.replace(/^#/, "");
  const tabs = [...document.querySelectorAll("nav a[data-tab]")].map((a) => a.dataset.tab);
  let target = hash.startsWith("traj/") ? "trajectory" : hash;
  if (!document.getElementById("sec-" + target)) target = tabs[0];
  for (const sec of document.querySelectorAll("section.tab")) sec.hidden = sec.id !== "sec-" + target;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === target);
  if (target === "trajectories" && !built.list) { built.list = true; buildList(document.getElementById("sec-trajectories")); }
  if (target === "groups" && !built.groups) { built.groups = true; buildGroups(document.getElementById("sec-groups")); }
  if (target === "trajectory") { showTrajectory(Number(hash.slice(5))); window.scrollTo(0, 0); }
}

loadData().then((data) => {
  state.data = data;
  document.getElementById("loading").remove();
  document.body.dataset.ready = "1";
  window.addEventListener("hashchange", route);
  route();
}).catch((err) => {
  document.getElementById("loading").textContent = "could not read the report data: " + err;
});
