"""`ncclbench pairs`: send/recv bandwidth between every pair of ranks of one job, and which
rank, host or link is slow.

Screening is a round-robin tournament (every rank in one pair per round, pairs side by side
as collectives load the fabric); what it finds low is measured again in localisation rounds
(a low rank with fresh partners that tested clean, a low pair as itself), and the verdict
comes from the localisation core (ncclbench.locate), as preflight's and fleet's do: a rank
slow with every partner drains its host, a pair slow on its own is a slow link."""
