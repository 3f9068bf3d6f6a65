-- SPDX-License-Identifier: Apache-2.0
-- 020: a request's stacked causes and its wait-for chain (RequestAttribution.causes,
-- .chain; streams/causes.py, streams/wait_chain.py). `causes` holds every cause with
-- its share of the excess, largest first (`cause` is the first where it explains at
-- least half); `chain` the threads its carrying thread slept on, hop by hop: who woke
-- it, what kept that thread from doing so sooner (kind, ns, culprit). Empty for rows
-- written before. Safe to re-run.
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS
    causes Array(Tuple(cause LowCardinality(String), share Float32)) DEFAULT [];
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS
    chain Array(Tuple(tid UInt32, comm String, waited_ns UInt64, kind LowCardinality(String), ns UInt64,
                      culprit String)) DEFAULT [];
