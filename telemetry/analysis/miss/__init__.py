"""Why a request missed: the match walk re-run on a snapshot (``walk``), the per-node reasons
(``why``), a key's history in the journal (``history``) and the explainer over them
(``explain``): one feature in four modules."""
