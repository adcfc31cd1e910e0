"""Gemini models as the agents' brains.

    client.py   credentials from the environment as the SDK reads them; the SDK's async
                client on httpx (trio); one JSON call, streamed or not, with retries (429,
                5xx, timeouts; a zero quota fails at once), usage, dated cost
    parsing.py  pure: model text → AnalysisResult / ranked OptimizationProposals, repaired,
                validated, clamped; ModelOutputError says why for the re-prompt
    brain.py    GeminiBrain (the Brain protocol of afs.brains): prompts filled with
                the context, re-prompts, usage and a record per call (the model version
                that answered, cost), the spending cap and the agent's model budget; the
                loop's turns as one conversation (refine); check_models; open_gemini_squad
    withheld.py pure: the context without the user's values (send_values false), and
                the literals put back into the model's SQL
    syntax.py   pure: the oldest PostgreSQL that runs a proposal's SQL (from the parse tree)
    prompts/    system prompt, analysis and proposal templates per specialisation; the
                shared blocks (ranked candidates, rewrites, safety rules); the loop's turn
                (refine)

The fake Gemini server for tests and demos is `afs.testing.FakeGemini`.
"""
