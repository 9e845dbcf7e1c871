"""What the empty chat offers a newcomer: one line on what speculation does, and prompts that show
it. Drafting pays where the answer repeats what it was given (prompt lookup copies it, a draft
model guesses it), so the starters are copying and editing tasks with their text inside the prompt,
and they run at temperature 0 (STARTER_TEMPERATURE).

Chosen by what the demo (SmolLM2-135M, prompt lookup) does with them at temperature 0, one run
each on this 2-core CPU (2026-11-28): the email and the poem are the bench suite's copy prompts
(benchmarks/suite.json), copied back with 97% and 94% of drafts accepted (5.2 and 4.7 tokens a
pass); the paragraph 72% (3.2). The earlier "Repeat a poem" (four lines of Dover Beach, "line by
line") was paraphrased and cut short even at temperature 0 (38% accepted, 1.7 tokens a pass), and
"Edit a function" answered with one sentence about the rename (nothing drafted). At the chat's
default 0.7 the demo paraphrases instead of copying, so lookup has nothing to find: the welcome
screen then promised a speedup that the card showed as "slower" (issue 46)."""

from __future__ import annotations

EXPLAINER = ("Tandem writes with two models: a small draft proposes the next few tokens and the model checks them "
             "all in one pass, so the answer is exactly the model's own, only sooner. It pays most where the "
             "answer repeats what it was given.")

DEMO_NOTE = ("The demo's model is tiny (135M parameters), so only copying and editing tasks speed up here. "
             "For a real speedup on any question, pick a known-good pair from the Target slot's menu.")

# Copy tasks are asked for the model's most likely words: each starter's chat is set to this, said
# in the chat when it is sent, and changed in the chat's settings like any other
STARTER_TEMPERATURE = 0.0
STARTER_NOTE = ("Copy and edit tasks like this one run at temperature 0, the model's most likely words, which a "
                "draft can copy from the prompt. This chat's temperature is in its settings (Ctrl+,); new chats "
                "use your default.")

STARTERS = (
    ("Correct an email",
     ("Correct the spelling in this email and write out the corrected email in full:\n"
      "\n"
      "Dear Mr Thompson,\n"
      "\n"
      "Thank you for your leter of last week. I am writting to confirm that the meeting will take "
      "place on Tuesday at ten oclock in the main office. Please bring the documents we discused, "
      "and let me know if you need a parking space.\n"
      "\n"
      "We will also review the budget for the next quarter, so it would be helpfull if you could "
      "send the latest figures before Monday. If the time does not suit you, please call my "
      "assistant and she will find another date.\n"
      "\n"
      "Best regards,\n"
      "Anna Williams")),
    ("Repeat a poem",
     ("Repeat this poem exactly, then give it a title:\n"
      "\n"
      "The rain falls soft on the quiet town,\n"
      "the lamps are lit as the sun goes down,\n"
      "the children run through the puddles home,\n"
      "and the old cat sleeps by the garden stone.\n"
      "\n"
      "The baker shuts his yellow door,\n"
      "the sweeper finishes the floor,\n"
      "the last bus hums along the hill,\n"
      "and all the busy streets are still.\n"
      "\n"
      "The river carries the evening light\n"
      "past the bridge and into the night,\n"
      "and somewhere a window, warm and wide,\n"
      "keeps a lamp for the ones outside.")),
    ("Fix the typos in a paragraph",
     "Fix the typos in this paragraph and give it back otherwise unchanged:\n\n"
     "Speculative decodign lets a smal model draft the next few tokens while the large model cheks them "
     "all at once. When the draft is rigth, several tokens are acepted in a single pass, and the answer is "
     "exactly what the large model would have writen on its own."),
)
