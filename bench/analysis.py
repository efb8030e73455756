"""Turn the two ranks' raw step measurements into the reported figures.

Definitions (all per job, i.e. per model, inner compiler, link rate, batch):
  step        the slower rank's wall time of one training step (zero_grad,
              forward, loss, backward including DDP's allreduce wait, SGD step)
  T_comm      allreduce time of all gradient bytes in one call, from the fit
              time = a + b*bytes over several sizes measured on the link
  compute     the "compute only" variant (compiled, unsplit, under no_sync):
              F forward, B backward, O optimizer + zero_grad, from its profile
  exposed     step - compute-only step (same rounds): communication not hidden
  hidden      (compute-only step + T_comm) - step: what overlap saved
  hideable    min(B, T_comm): at most this much can overlap with backward
  ideal       F + O + max(B, T_comm): perfect overlap, no slowdown of compute
              by the network stack, one allreduce of everything with no
              per-bucket latency; a lower bound set by the link
  CPU bound   compute-only step + T_comm * (CPU seconds of network work per
              second of allreduce and rank: the machine's busy cores during
              an allreduce, shared by the two ranks). Each rank has one core,
              so compute and the network stack add up on it however well
              they overlap; an estimate of the floor set by the core
  bound       max(ideal, CPU bound): what the better of the two allows
  vs torch    per round, this variant's median step / torch DDPOptimizer's
              median step; median and spread over rounds (paired, so slow
              drifts of the shared machine cancel)
"""

from __future__ import annotations

import math

from bench import stats, variants

MiB = 1 << 20


def _slower_rank(ranks: list[dict], vname: str, key: str) -> list[dict]:
    """Per step index, the record of the rank whose `key` was larger."""
    series = [r["variants"][vname][key] for r in ranks]
    return [max(recs, key=lambda x: x["total"]) for recs in zip(*series)]


def link_fit(ranks: list[dict]) -> dict:
    # Both ranks time the same collectives; keep the slower view of each.
    points = [max(ps, key=lambda p: p["seconds"]) for ps in zip(*(r["link"]["points"] for r in ranks))]
    fit = stats.fit_line([p["bytes"] for p in points], [p["seconds"] for p in points])
    fit["bandwidth_mib_s"] = 1.0 / fit["b"] / MiB if fit["b"] > 0 else float("nan")
    fit["points"] = points
    return fit


def cpu_cost(ranks: list[dict]) -> dict:
    """CPU seconds burnt per second of allreduce, per rank and machine-wide."""
    out = {}
    for r in ranks:
        c = r["link"]["cpu_during_allreduce"]
        wall = c["wall"]
        out[f"rank{r['rank']}"] = {"user_per_s": c["user"] / wall, "sys_per_s": c["sys"] / wall,
                                   "MiB_per_s": c["bytes_each"] * c["count"] / wall / MiB}
        machine = {k[len("machine_"):]: v / wall for k, v in c.items() if k.startswith("machine_")}
        if machine:
            # Both ranks measure the same machine at about the same time;
            # keep one view.
            machine["busy_cores"] = sum(v for k, v in machine.items() if k not in ("idle", "iowait"))
            out["machine"] = machine
    inter = [r["link"]["interference"] for r in ranks]
    # CPU per second of allreduce, per rank: the machine's busy cores shared
    # by the ranks. The rank's own user+sys is not enough (softirq work runs
    # outside it) and cannot be added to softirq either (tick accounting
    # charges softirq to whichever task it interrupted). Machine-wide, so
    # other load on the machine inflates it: an estimate.
    own = max(out[f"rank{r['rank']}"]["user_per_s"] + out[f"rank{r['rank']}"]["sys_per_s"] for r in ranks)
    busy = out.get("machine", {}).get("busy_cores")
    out["comm_cpu_per_s"] = max(own, busy / len(ranks)) if busy is not None else own
    out["compute_slowdown_during_allreduce"] = max(
        i["compute_during_allreduce_s"] / i["compute_alone_s"] for i in inter)
    out["interference"] = inter
    return out


def summarize_job(ranks: list[dict]) -> dict:
    r0 = ranks[0]
    job = r0["job"]
    grad_bytes = r0["workload"]["grad_bytes"]
    fit = link_fit(ranks)
    t_comm = fit["a"] + fit["b"] * grad_bytes
    names = [n for n in job["variants"] if all("steps" in r["variants"].get(n, {}) for r in ranks)]
    failed = {n: r0["variants"].get(n, {}).get("error", "missing")
              for n in job["variants"] if n not in names}

    rows: dict[str, dict] = {}
    for n in names:
        steps = _slower_rank(ranks, n, "steps")
        prof = _slower_rank(ranks, n, "profile")
        per_round: dict[int, list[float]] = {}
        for s in steps:
            per_round.setdefault(s["round"], []).append(s["total"])
        info = [r["variants"][n]["info"] for r in ranks]
        lb = [r["variants"][n]["link_bytes"] for r in ranks]
        bytes_per_step = [
            stats.median(b["qdisc_bytes"] / b["steps"] for b in rank_lb) if rank_lb else None
            for rank_lb in lb
        ]
        rows[n] = {
            "label": r0["variants"][n]["label"],
            "step": stats.summarize(s["total"] for s in steps),
            "samples": [s["total"] for s in steps],
            "round_medians": {r: stats.median(v) for r, v in per_round.items()},
            "fwd": stats.median(p["fwd"] for p in prof),
            "bwd": stats.median(p["bwd"] for p in prof),
            "opt": stats.median(p["opt"] for p in prof),
            "cpu_per_step": stats.median(s["user"] + s["sys"] for s in steps),
            "first_step_s": max(i["first_step_s"] for i in info),
            "compile_wall_s": max(i.get("compile_wall_s", float("nan")) for i in info),
            "graphs": info[0].get("graphs_after_warmup"),
            "recompiled": any(r["variants"][n].get("recompiled") for r in ranks),
            # goddp compiles the whole graph when planning or cutting fails:
            # such a row measures an unsplit graph and must say so.
            "fallbacks": sorted({f for i in info for f in i.get("goddp_fallbacks", [])}),
            "link_bytes_per_step": bytes_per_step,
            "link_drops": sum(b["drops"] for rank_lb in lb for b in rank_lb),
            "ddp_buckets": r0["variants"][n].get("ddp_buckets_end") or info[0].get("ddp_buckets"),
            "pieces": _pieces(info[0]),
            "launch": r0["variants"][n].get("launch"),
            # The larger rank's; absent in results from before the measure.
            "step_peak_mib": max((r["variants"][n]["step_peak_mib"] for r in ranks
                                  if "step_peak_mib" in r["variants"][n]), default=None),
        }
        rows[n]["compute"] = rows[n]["fwd"] + rows[n]["bwd"] + rows[n]["opt"]

    out = {
        "name": job["name"], "job": job, "workload": r0["workload"], "grad_bytes": grad_bytes,
        "link": {k: v for k, v in fit.items()}, "t_comm": t_comm, "cpu": cpu_cost(ranks),
        "variants": rows, "failed": failed,
        "peak_rss_mib": [r.get("max_rss_mib") for r in ranks],
    }
    ref = rows.get("compute_only")
    if ref:
        f, b, o = ref["fwd"], ref["bwd"], ref["opt"]
        compute_step = ref["step"]["median"]
        out["ideal"] = f + o + max(b, t_comm)
        out["compute_step"] = compute_step
        out["comm_cpu_per_s"] = out["cpu"]["comm_cpu_per_s"]
        out["cpu_bound"] = compute_step + t_comm * out["comm_cpu_per_s"]
        out["bound"] = max(out["ideal"], out["cpu_bound"])
        out["hideable"] = min(b, t_comm)
        out["regime"] = _regime(b, t_comm)
        for n, row in rows.items():
            med = row["step"]["median"]
            row["vs_ideal"] = med / out["ideal"]
            row["vs_bound"] = med / out["bound"]
            if n != "compute_only":
                row["exposed"] = med - compute_step
                row["hidden"] = compute_step + t_comm - med
                row["hidden_of_hideable"] = row["hidden"] / out["hideable"] if out["hideable"] > 0 else float("nan")
    base = rows.get(variants.BASELINE)
    for n, row in rows.items():
        if base and n != variants.BASELINE:
            row["vs_torch"] = stats.paired_ratios(row["round_medians"], base["round_medians"])
        twin = rows.get(variants.TRACED_TWIN.get(n, ""))
        if twin:
            # goddp.trace's overhead: traced over untraced, paired per round.
            row["trace_overhead"] = stats.paired_ratios(row["round_medians"], twin["round_medians"])
        if row["link_bytes_per_step"][0] is not None and n != "compute_only":
            row["link_bytes_vs_grad"] = max(row["link_bytes_per_step"]) / grad_bytes
    return out


def _regime(backward: float, t_comm: float) -> str:
    q = backward / t_comm if t_comm > 0 else math.inf
    if q > 1.5:
        return "compute-bound"
    if q < 1 / 1.5:
        return "communication-bound"
    return "balanced"


def _pieces(info: dict) -> dict | None:
    """What the splitter decided: piece count and bucket bytes in DDP order."""
    if info.get("ddp_optimizer"):
        call = info["ddp_optimizer"][-1]
        # torch lists buckets in forward order; DDP order is the reverse.
        return {"count": len(call["buckets"]),
                "bucket_bytes": [b["bytes"] for b in reversed(call["buckets"])],
                "extended": sum(b["extended"] for b in call["buckets"])}
    plans = info.get("goddp_plans")
    if plans:
        p = plans[-1]
        return {"count": p.get("num_pieces"), "bucket_bytes": p.get("bucket_bytes"),
                "extended": p.get("extended"), "fallback": p.get("fallback")}
    return None


# ----------------------------------------------------------------- printing

COLUMNS = ("variant", "median", "p90", "spread", "vs torch (paired)", "exposed", "hidden", "overlap eff",
           "x ideal", "x bound", "compute", "CPU/step", "link B/step", "first step", "graphs")


def job_table(s: dict) -> str:
    rows = []
    for n, r in s["variants"].items():
        st = r["step"]
        vt = r.get("vs_torch")
        reference = n == "compute_only"
        vs = "baseline" if n == variants.BASELINE else "-" if reference else (
            f"{stats.fmt_ratio(vt['median'])} [{stats.fmt_ratio(vt['min'])}-{stats.fmt_ratio(vt['max'])}]"
            + (" SLOWER" if n.startswith("goddp") and vt["median"] > 1.0 else "") if vt else "-")
        lb = r.get("link_bytes_vs_grad")
        rows.append([
            r["label"] + (" (RECOMPILED)" if r["recompiled"] else "") + (" (FELL BACK)" if r["fallbacks"] else ""),
            stats.fmt_s(st["median"]), stats.fmt_s(st["p90"]),
            f"{stats.fmt_s(st['min'])}-{stats.fmt_s(st['max'])}", vs,
            stats.fmt_s(r.get("exposed")), stats.fmt_s(r.get("hidden")),
            _overlap_text(r, s), "-" if reference else stats.fmt_ratio(r.get("vs_ideal")),
            "-" if reference else stats.fmt_ratio(r.get("vs_bound")), stats.fmt_s(r["compute"]), stats.fmt_s(r["cpu_per_step"]),
            "-" if lb is None else f"{lb:.2f}x grads", stats.fmt_s(r["first_step_s"]),
            "eager" if r["graphs"] is None else r["graphs"],
        ])
    fit = s["link"]
    wl = s["workload"]
    head = (f"== {s['name']}: {wl['description']}, inner={s['job']['inner']}, "
            f"link {s['job'].get('rate', 'unshaped')}, grads {stats.fmt_bytes(s['grad_bytes'])}, "
            f"n={s['variants'][next(iter(s['variants']))]['step']['n']} steps/variant ==")
    lines = [stats.table(COLUMNS, rows, title=head)]
    if "ideal" in s:
        co = s["variants"]["compute_only"]
        lines.append(
            f"ideal {stats.fmt_s(s['ideal'])} = F {stats.fmt_s(co['fwd'])} + O {stats.fmt_s(co['opt'])} "
            f"+ max(B {stats.fmt_s(co['bwd'])}, T_comm {stats.fmt_s(s['t_comm'])}); "
            f"regime: {s['regime']}; allreduce fit {fit['a'] * 1e3:.1f}ms + bytes/"
            f"{fit['bandwidth_mib_s']:.0f}MiB/s (R^2 {fit['r2']:.3f})")
        lines.append(
            f"CPU bound {stats.fmt_s(s['cpu_bound'])} = compute-only step {stats.fmt_s(s['compute_step'])} + "
            f"T_comm x {s['comm_cpu_per_s']:.2f} CPU-s of network work per s; the tighter bound is the "
            + ("CPU (one core per rank)" if s["cpu_bound"] > s["ideal"] else "link"))
    cpu = s["cpu"]
    m = cpu.get("machine", {})
    lines.append(
        "during allreduce: rank0 CPU {:.2f} user + {:.2f} sys per s, machine {:.2f} cores busy "
        "(softirq {:.2f}); compute runs {:.2f}x slower while an allreduce is in flight".format(
            cpu["rank0"]["user_per_s"], cpu["rank0"]["sys_per_s"], m.get("busy_cores", float("nan")),
            m.get("softirq", float("nan")), cpu["compute_slowdown_during_allreduce"]))
    for n, r in s["variants"].items():
        if "trace_overhead" in r:
            to = r["trace_overhead"]
            lines.append(
                f"goddp.trace overhead ({r['label']} / {s['variants'][variants.TRACED_TWIN[n]]['label']}, "
                f"paired per round): median {to['median']:.3f} [{to['min']:.3f}-{to['max']:.3f}] over {to['n']} rounds")
    for n, err in s["failed"].items():
        lines.append(f"FAILED {n}: {err.splitlines()[0] if err else ''}")
    for n, r in s["variants"].items():
        for f in r["fallbacks"]:
            lines.append(f"FELL BACK {n}: goddp compiled the whole graph: {f}")
    lines.append(link_check_text(s))
    if all(s.get("peak_rss_mib") or [None]):
        lines.append("peak RSS per rank: " + ", ".join(f"{m / 1024:.1f} GiB" for m in s["peak_rss_mib"])
                     + f" ({len(s['variants'])} model copies each)")
    lines.append(alignment_text(s))
    peak = peak_text(s)
    if peak:
        lines.append(peak)
    return "\n".join(lines)


def peak_text(s: dict) -> str:
    """Each variant's step peak memory, and its ratio to the baseline's."""
    rows = {n: r["step_peak_mib"] for n, r in s["variants"].items() if r.get("step_peak_mib") is not None}
    if not rows:
        return ""
    base = rows.get(variants.BASELINE)
    return ("step peak memory (one step without communication, the allocator's peak above its start): "
            + ", ".join(f"{s['variants'][n]['label']} {m:.1f} MiB"
                        + (" (baseline)" if n == variants.BASELINE else f" ({m / base:.2f}x)" if base else "")
                        for n, m in rows.items()))


def link_check_text(s: dict) -> str:
    """Did the gradients really cross the shaped link? (qdisc byte counters)"""
    seen = {n: r["link_bytes_vs_grad"] for n, r in s["variants"].items() if "link_bytes_vs_grad" in r}
    if not seen:
        return "link check: no qdisc counters (unshaped run)"
    low = [n for n, q in seen.items() if q < 0.9]
    drops = sum(r.get("link_drops", 0) for r in s["variants"].values())
    text = (f"link check: per DDP step each rank's tbf qdisc passed {min(seen.values()):.2f}-"
            f"{max(seen.values()):.2f}x the gradient bytes (a 2-rank ring allreduce sends ~1x); drops {drops}")
    if low:
        text += f"; WARNING: {', '.join(low)} sent less than the gradients: traffic bypassed the link?"
    co = s["variants"].get("compute_only", {}).get("link_bytes_per_step") or [None]
    if co[0] is not None:
        text += f"; compute only sent {max(co) / MiB:.2f} MiB/step (barriers)"
    return text


def _overlap_text(row: dict, s: dict) -> str:
    # Below 10 ms of possible overlap the ratio is noise over noise.
    if "hidden_of_hideable" not in row or s.get("hideable", 0) < 0.01:
        return "-"
    return f"{row['hidden_of_hideable']:.0%}"


def alignment_text(s: dict) -> str:
    """DDP's real buckets, the splitter's planned buckets, and when each DDP
    bucket's allreduce actually launched (from a timing comm hook).

    "lead" is how long before the end of backward compute (goddp.trace's
    compute end: the autograd engine finished, before DDP waits) each bucket launched, in DDP order; "head start" is the
    byte-weighted mean lead, also as a share of the backward. The backward
    compute itself stretches while allreduces run on the same core.
    torch counts a parameter at every use, so its planned bytes exceed DDP's
    for shared weights.
    """
    out = []
    for n, r in s["variants"].items():
        if n == "compute_only":
            continue
        ddp = (r.get("ddp_buckets") or {}).get("rebuilt_bucket_sizes")
        ddp_sizes = [int(x) for x in str(ddp).split(",")] if ddp else []
        pieces = r.get("pieces") or {}
        ddp_mib = "-" if not ddp_sizes else " ".join(f"{x / MiB:.1f}" for x in ddp_sizes)
        cut = " ".join(f"{x / MiB:.1f}" for x in pieces.get("bucket_bytes") or []) or "-"
        launch = r.get("launch") or {}
        trace = launch.get("trace")
        if trace:
            # "bucket": runs recorded before goddp.trace (reanalysis)
            by_bucket = sorted(trace["buckets"], key=lambda b: b.get("index", b.get("bucket")))
            lead = " ".join(f"{(trace['compute_end_s'] - b['launch_s']) * 1e3:.0f}" for b in by_bucket)
            head = (f"{launch['head_start_s'] * 1e3:.0f} ms ({launch['head_start_of_backward']:.0%} of backward); "
                    f"backward compute {stats.fmt_s(trace['compute_end_s'])} vs {stats.fmt_s(r['bwd'])} "
                    "without communication")
        else:
            lead, head = "-", launch.get("error", "-")
        out.append(f"  {n:13s} DDP (MiB): {ddp_mib:26s} planned (MiB): {cut:26s} "
                   f"lead (ms): {lead:22s} head start: {head}")
    return ("buckets in DDP order; lead = allreduce launch before the end of backward compute; "
            "head start = byte-weighted mean lead:\n" + "\n".join(out)) if out else ""


