"use strict";
// The trajectory viewer. data/manifest.js lists each run's dumped steps and their problems;
// choosing a step loads data/<run>/step_<N>.js, which calls CBPO_SITE.dump (a page opened
// from file:// may run a script beside it but not fetch JSON).
window.CBPO_SITE = (function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const docs = {};
  let manifest = null;

  function fill(select, items, text) {
    select.replaceChildren(...items.map((item, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = text(item);
      return o;
    }));
  }
  const run = () => manifest.runs[+$("run").value];
  const step = () => run().steps[+$("step").value];
  const key = (name, n) => `${name}/${n}`;
  // The newest step, problem and run with a branch: what a reader opens the viewer to see.
  const branched = (s) => s.problems.some((p) => p.branches > 0);

  function chooseRun() {
    const steps = run().steps;
    fill($("step"), steps, (s) => `step ${s.step}` + (branched(s) ? "" : " (no branches)"));
    const newest = steps.map(branched).lastIndexOf(true);
    $("step").value = String(newest >= 0 ? newest : steps.length - 1);
    chooseStep();
  }

  function chooseStep() {
    const s = step();
    if (!s) return message("this run has no rollout dump (train with rl.dump_rollouts=true)");
    fill($("problem"), s.problems, (p) => `${p.id}: ${p.rollouts} rollouts, ${p.branches} branches`);
    $("problem").value = String(Math.max(0, s.problems.findIndex((p) => p.branches > 0)));
    if (docs[key(run().name, s.step)]) return render();
    const script = document.createElement("script");
    script.src = s.file;
    script.onerror = () => message(`cannot load ${s.file}`);
    document.body.appendChild(script);
  }

  function message(text) {
    $("tree").replaceChildren();
    const p = document.createElement("p");
    p.className = "missing";
    p.textContent = text;
    $("rollouts").replaceChildren(p);
  }

  function svg(name, attrs, text) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }

  const modelCount = (r) => r.model_mask.reduce((a, b) => a + b, 0);
  const rewardClass = (r) => (r.reward > 0 ? "win" : "lose");
  const describe = (r, k) => `#${k} ${r.kind}` + (r.kind === "branch" ? ` of #${r.parent} at b=${r.at}` : "");

  // Each rollout as a line over its model tokens; a branch starts at its boundary on its
  // parent's line. Chosen branch points are dots on the parent, rewards at the line's end.
  function drawTree(rollouts) {
    const longest = Math.max(1, ...rollouts.map(modelCount));
    const left = 120, width = 640, row = 22;
    const x = (m) => left + (width * m) / longest;
    const y = (k) => 14 + row * k;
    const tree = $("tree");
    tree.replaceChildren();
    tree.setAttribute("viewBox", `0 0 ${left + width + 90} ${y(rollouts.length)}`);
    tree.setAttribute("height", String(y(rollouts.length)));
    rollouts.forEach((r, k) => {
      const start = r.kind === "branch" ? r.at : 0;
      tree.appendChild(svg("text", { x: 4, y: y(k) + 4, class: "label" }, describe(r, k)));
      if (r.kind === "branch") {
        tree.appendChild(svg("path", { d: `M${x(start)},${y(r.parent)} L${x(start)},${y(k)}`, class: "branch" }));
      }
      tree.appendChild(svg("line", { x1: x(start), y1: y(k), x2: x(modelCount(r)), y2: y(k), class: `rollout ${r.kind}` }));
      (r.chosen || []).forEach((b) => tree.appendChild(svg("circle", { cx: x(b), cy: y(k), r: 4, class: "chosen" })));
      tree.appendChild(svg("text", { x: x(modelCount(r)) + 6, y: y(k) + 4, class: `reward ${rewardClass(r)}` },
        `R=${r.reward}`));
    });
  }

  // One rollout's tokens: model tokens coloured by entropy, observations boxed, candidate
  // windows underlined, chosen points marked, a branch's copied prefix faded.
  function drawTokens(r, k, w, low, range) {
    const box = document.createElement("div");
    box.className = `response ${r.kind}`;
    const head = document.createElement("div");
    head.className = "head";
    head.textContent = `${describe(r, k)}; reward ${r.reward}, ${r.finish}, ${r.tool_calls} tool calls`;
    head.classList.add(rewardClass(r));
    box.appendChild(head);
    const windows = new Set();
    (r.candidates || []).forEach((b) => { for (let m = b; m < b + (w || 1); m++) windows.add(m); });
    const chosen = new Set(r.chosen || []);
    const line = document.createElement("div");
    line.className = "tokens";
    let m = 0, obs = null;
    r.tokens.forEach((text, i) => {
      const span = document.createElement("span");
      span.textContent = text;
      span.dataset.rollout = String(k);
      span.dataset.index = String(i);
      if (r.model_mask[i]) {
        obs = null;
        if (chosen.has(m)) {
          const mark = document.createElement("span");
          mark.className = "mark";
          mark.textContent = "▼";
          mark.title = `chosen branch point b=${m}`;
          line.appendChild(mark);
        }
        span.className = "tok" + (windows.has(m) ? " window" : "") + (r.kind === "branch" && m < r.at ? " copied" : "");
        span.style.backgroundColor = `rgba(230, 110, 0, ${((r.entropy[i] - low) / range).toFixed(3)})`;
        span.dataset.model = String(m);
        line.appendChild(span);
        m += 1;
      } else {
        if (!obs) {
          obs = document.createElement("span");
          obs.className = "obs" + (r.kind === "branch" && m < r.at ? " copied" : "");
          obs.title = "tool observation";
          line.appendChild(obs);
        }
        span.className = "otok";
        obs.appendChild(span);
      }
    });
    box.appendChild(line);
    return box;
  }

  function tip(event, rollouts) {
    const t = event.target.closest("[data-index]");
    const tipBox = $("tip");
    if (!t) { tipBox.hidden = true; return; }
    const r = rollouts[+t.dataset.rollout], i = +t.dataset.index;
    const lines = [`token ${JSON.stringify(r.tokens[i])} (response position ${i})`];
    if (t.dataset.model !== undefined) {
      const m = +t.dataset.model;
      lines.push(`model token ${m}: entropy ${r.entropy[i]}, log-prob ${r.logprob ? r.logprob[i] : "n/a"}`);
      lines.push(`advantage ${r.advantage[m]}, loss mask ${r.loss_mask[m]}`);
    } else {
      lines.push("tool observation: no loss, no advantage");
    }
    tipBox.textContent = lines.join("\n");
    tipBox.style.left = `${event.clientX + 12}px`;
    tipBox.style.top = `${event.clientY + 12}px`;
    tipBox.hidden = false;
  }

  function render() {
    const s = step(), doc = docs[key(run().name, s.step)];
    if (!doc) return;
    const problem = doc.problems[+$("problem").value];
    const rollouts = problem.rollouts;
    const model = rollouts.flatMap((r) => r.entropy.filter((_, i) => r.model_mask[i]));
    const low = Math.min(...model), range = Math.max(1e-9, Math.max(...model) - low);
    drawTree(rollouts);
    $("rollouts").replaceChildren(...rollouts.map((r, k) => drawTokens(r, k, doc.w, low, range)));
    $("rollouts").onmousemove = (e) => tip(e, rollouts);
    $("rollouts").onmouseleave = () => { $("tip").hidden = true; };
    document.body.dataset.rendered = key(doc.run, doc.step);
  }

  return {
    manifest(m) {
      manifest = m;
      if (!m.runs.length) return message("no runs were given to the site");
      fill($("run"), m.runs, (r) => r.name);
      const first = m.runs.findIndex((r) => r.steps.some(branched));
      $("run").value = String(Math.max(0, first));
      $("run").onchange = chooseRun;
      $("step").onchange = chooseStep;
      $("problem").onchange = render;
      chooseRun();
    },
    dump(doc) {
      docs[key(doc.run, doc.step)] = doc;
      if (manifest && step() && key(run().name, step().step) === key(doc.run, doc.step)) render();
    },
  };
})();
