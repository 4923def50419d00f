"""Health page: whether the run finished cleanly, invariant violations with the op that caused
each, the doctor's findings and budget in plain words, and the telemetry pipeline's own
health."""

from __future__ import annotations

import streamlit as st

from radixscope.telemetry.analysis import doctor
from radixscope.ui import context, data
from radixscope.ui.shaping import health

ctx = context.require_store()
COLOURS = {"error": "red", "warning": "orange", "info": "blue"}


@st.fragment(run_every=ctx.run_every)
def health_body() -> None:
    seq = ctx.last_seq()
    snap = data.snapshot(ctx.path, seq)
    viol = health.violations_with_ops(data.violations(ctx.path, seq), data.ops(ctx.path, seq))
    known = doctor.pool_sizes_known(data.info(ctx.path, seq))  # not for a watched engine
    finds = health.findings_table(snap, data.events(ctx.path, seq), known)
    n_err = int((finds["severity"] == "error").sum())
    st.markdown(f"## Health at seq {seq:,}")
    status = data.run_status(ctx.path)
    if status["state"] == "bundle":
        st.info(status["message"])
    elif status["clean"]:
        st.caption(status["message"])
    else:
        st.warning(status["message"] + ". A live run shows this until it closes.")
    fault = health.injected_fault(data.events(ctx.path, seq))
    if fault is not None:
        st.error(health.injection_words(fault, viol), icon=":material/bug_report:")
    a, b, c = st.columns(3)
    a.metric("Recorded violations", f"{len(viol):,}")
    b.metric("Doctor errors now", f"{n_err:,}")
    c.metric("Doctor warnings now", f"{int((finds['severity'] == 'warning').sum()):,}")

    st.markdown("### Invariant violations")
    if viol.empty:
        st.success("No invariant violation was recorded in this store.")
    else:
        shown = viol.drop(columns="message")
        ev = st.dataframe(shown, hide_index=True, key="health.viol", on_select="rerun",
                          selection_mode="single-row")
        rows = ev["selection"]["rows"] if ev else []
        v = viol.iloc[rows[0] if rows else 0]
        st.markdown(f"**Violation {v['id']}** at seq {v['seq']} — caused by op "
                    f"{v['op_id']} (`{v['op']}`, request {v['req_id']}) — rule "
                    f"`{v['rule']}`, nodes {v['nodes'] or 'none named'}")
        lines = health.violation_lines(v["message"])
        if lines.empty:
            st.code(v["message"], language=None)
        else:
            st.dataframe(lines, hide_index=True)
        if v["seq"] is not None and st.button("Open the tree at this seq",
                                              icon=":material/history:"):
            st.switch_page("app_pages/time_travel.py", query_params={"seq": str(v["seq"])})

    st.markdown("### Doctor")
    if finds.empty:
        st.success("No finding: every pool balances and every lock and transfer names live "
                   "nodes.")
    for f in finds.itertuples(index=False):
        st.markdown(f":{COLOURS[f.severity]}[**{f.severity.upper()}**] **{f.subject}**: "
                    f"{f.message}")
    st.markdown("**Budget in plain words**")
    for line in doctor.budget_words(snap, known):
        st.markdown(f"- {line}")

    st.markdown("### Telemetry")
    for line in health.telemetry_words(data.info(ctx.path, seq)):
        st.markdown(f"- {line}")


health_body()
