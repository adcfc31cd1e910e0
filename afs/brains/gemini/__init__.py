"""Gemini models as the agents' brains.

    client.py   credentials from the environment; the SDK's async client on httpx
                (trio); one JSON call with retries (429, 5xx, timeouts), usage, cost
    parsing.py  pure: model text → AnalysisResult / ranked OptimizationProposals, repaired,
                validated, clamped; ModelOutputError says why for the re-prompt
    brain.py    GeminiBrain (the Brain protocol of afs.brains): prompts filled with
                the context, re-prompts, usage per agent; open_gemini_squad
    prompts/    system prompt, analysis and proposal templates per specialisation; the
                shared blocks (ranked candidates, rewrites, safety rules)

The fake Gemini server for tests and demos is `afs.testing.FakeGemini`.
"""
