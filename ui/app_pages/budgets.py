"""Budgets page: every pool over time, the budget now in words, admissions and refusals."""

from __future__ import annotations

import streamlit as st

from radixscope.telemetry.analysis import doctor
from radixscope.ui import context, data
from radixscope.ui.shaping import budgets as bud

ctx = context.require_store()
REPLAY_LIMIT = 200_000  # mutations replayed by default (about 5 s)


@st.fragment(run_every=ctx.run_every)
def budgets_body() -> None:
    seq = ctx.last_seq()
    snap = data.snapshot(ctx.path, seq)
    st.markdown(f"## Budgets at seq {seq:,}")
    table = bud.budget_table(snap)
    st.dataframe(table, hide_index=True, column_config={
        "used_pct": st.column_config.ProgressColumn("used", min_value=0, max_value=100,
                                                    format="%.1f%%")})
    with st.expander("In plain words", expanded=True):
        for line in doctor.budget_words(snap, doctor.pool_sizes_known(data.info(ctx.path, seq))):
            st.markdown(f"- {line}")

    st.markdown("### Over time")
    metrics = data.metrics(ctx.path, seq)
    sampled = metrics["seq"].nunique() if not metrics.empty else 0
    exact = st.toggle("Replay the journal (exact at every change)", key="bud.replay",
                      value=sampled < 50 and seq <= REPLAY_LIMIT,
                      help=f"Off: the store's {sampled} pool samples. On: the ledgers rebuilt "
                           "from the journal at up to 400 points.")
    if exact:
        metrics = data.replayed_metrics(ctx.path, seq)
    if metrics.empty:
        st.info("No metric samples in this store yet.")
    else:
        tiers = bud.present_tiers(metrics)
        st.plotly_chart(bud.budget_figure(metrics, snap.components, tiers),
                        config={"displayModeBar": False})
        source = "journal replay" if exact else "store samples"
        st.caption(f"{metrics['seq'].nunique():,} points ({source}); the stack sums to each "
                   "pool's capacity (in flight is the part of protected whose copy is not "
                   "acked).")

    st.markdown("### Admissions")
    adm = bud.admissions_table(data.events(ctx.path, seq))
    if adm.empty:
        st.caption("No admission decisions recorded in this store (the engine records them "
                   "with `tel.record_admission`).")
    else:
        n = adm["verdict"].value_counts()
        a, b, c, d = st.columns(4)
        a.metric("Decisions", f"{len(adm):,}")
        b.metric("Admitted", f"{int(n.get('admitted', 0)):,}")
        c.metric("Refused", f"{int(n.get('refused', 0)):,}",
                 help="did not fit when asked; the request waited and asked again")
        d.metric("Rejected", f"{int(n.get('rejected', 0)):,}", help="can never fit")
        st.dataframe(bud.admission_summary(adm), hide_index=True)
        only_refused = st.toggle("Only refusals", value=not adm["admitted"].all(),
                                 key="adm.refused")
        shown = adm[~adm["admitted"]] if only_refused else adm
        st.dataframe(shown, hide_index=True, height=280)

    failed = bud.failed_ops(data.ops(ctx.path, seq))
    st.markdown("### Operations that raised")
    if failed.empty:
        st.caption("None: no cache operation raised (no out-of-memory allocation, no bad input).")
    else:
        st.dataframe(failed, hide_index=True)


budgets_body()
