"""How a scripted user reads what the agent says: text helpers and the regex families of agent moves.

Small models do not phrase things like the expert, so a scripted user recognises questions, proposals,
refusals and reports by keyword *families*, not exact strings, and compares identifiers, numbers and
dates by value. Everything here is domain-neutral: it is shared by the generic
:class:`muarl.users.script.UserScript` and by every domain's own script.
"""

from __future__ import annotations

import re


# -- text helpers -------------------------------------------------------------------------------------------
def norm(text: str) -> str:
    """Lower-case, straight quotes, collapsed whitespace: the form every pattern below is matched on."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return " ".join(text.lower().split())


_NUM = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """Every number written in ``text`` ($1,234.50 -> 1234.5)."""
    plain = text.replace(",", "").replace("$", " ")
    return [float(n) for n in _NUM.findall(plain)]


def says_number(text: str, value: float) -> bool:
    return any(abs(n - value) < 0.005 for n in numbers(text))


def says(text: str, value: str) -> bool:
    """Whether ``text`` (normalised) mentions ``value`` as a whole word or phrase (numbers by value)."""
    target = norm(str(value)).strip()
    if not target:
        return False
    if re.fullmatch(r"-?\d+(?:\.\d+)?", target.replace(",", "").replace("$", "")):
        return says_number(text, float(target.replace(",", "").replace("$", "")))
    return re.search(rf"(?<![\w]){re.escape(target)}(?![\w])", text) is not None


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]


def says_date(text: str, iso: str) -> bool:
    """An ISO date written as 2024-05-29, May 29 or 29 May (the year optional in words)."""
    if iso in text:
        return True
    try:
        _, month, day = (int(p) for p in iso.split("-"))
    except ValueError:
        return False
    if not 1 <= month <= 12:
        return False
    name = _MONTHS[month - 1]
    return re.search(rf"\b({name}|{name[:3]})\.? {day}(st|nd|rd|th)?\b|\b{day}(st|nd|rd|th)? (of )?({name}|{name[:3]})\b",
                     text) is not None


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def says_value(text: str, value: object) -> bool:
    """Whether normalised ``text`` states one scalar ``value``: numbers by value, ISO dates in any usual
    form, anything else as a whole word or phrase."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return says_number(text, float(value))
    if isinstance(value, str) and _ISO_DATE.fullmatch(value.strip()):
        return says_date(text, value.strip())
    return says(text, str(value))


def first_person(text: str) -> str:
    """Turn a scenario's second-person symptom ("your phone ...") into the user's own words."""
    swaps = [(r"\byou are\b", "I am"), (r"\byou're\b", "I'm"), (r"\byou have\b", "I have"),
             (r"\byou've\b", "I've"), (r"\byour\b", "my"), (r"\byourself\b", "myself"), (r"\byou\b", "I")]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    return text[:1].upper() + text[1:]


def sentences(text: str) -> list[str]:
    """Split agent text into sentences (keeping '?') so an instruction and a question are told apart."""
    parts = re.split(r"(?<=[.!?])\s+|\n+|;\s+", text)
    return [p.strip() for p in parts if p.strip()]


def words(name: str) -> str:
    """A tool or fact key as people say it: "card_number" -> "card number"."""
    return name.replace("_", " ").strip()


def phrase_pattern(phrase: str) -> str:
    """A regex for ``phrase`` as whole words in normalised text, spaces, underscores or hyphens between."""
    parts = [re.escape(p) for p in re.split(r"[\s_-]+", norm(phrase)) if p]
    return r"(?<!\w)" + r"[ _-]?".join(parts) + r"(?!\w)" if parts else r"$^"


# -- what the agent may be doing ---------------------------------------------------------------------------
ASK = re.compile(
    r"\?|\b(please|kindly)\b.*\b(provide|share|give|tell|confirm|send|let me know|state|enter|type)\b|"
    r"\b(could|can|would|will) you\b|\bmay i (have|get|know|ask)\b|\bi('ll| will)? need\b|\bneed (your|the)\b|"
    r"\blet me know\b|\bwhat('s| is| are)\b|\bwhich\b|\bprovide\b|\btell me\b"
)
PROPOSAL = re.compile(
    r"\b(shall|should) i\b|\b(can|may) i (go ahead|proceed|now|cancel|process|submit|make|change|update|book|add|"
    r"send|apply|place|request|enable|suspend|resume|refuel|switch|upgrade|issue|return|exchange|modify|move)\b|"
    r"\bwould you like (me|us) to\b|\bdo you want (me|us) to\b|\bwant me to\b|"
    r"\b(like|want|ok|okay|happy) (for me )?to proceed\b|\bproceed\b|\bgo ahead\b|\(yes/no\)|\byes or no\b|"
    r"\bconfirm (that|this|the (above|following|change|details|action|cancellation|return|exchange|"
    r"modification|booking|request|update|refuel|upgrade))\b|\bplease confirm\b|\bdo you confirm\b|"
    r"\b(is|does) (that|this) (ok|okay|correct|right|fine|sound good|look good|work)\b|\bare you sure\b|"
    r"\bcan you confirm\b|\bcould you confirm\b|\bi('ll| will) (now )?(go ahead|proceed)\b"
)
REFUSAL = re.compile(
    r"\b(can ?not|can't|cant|unable|not able|won't be able|not allowed|not permitted|not possible|"
    r"not eligible|isn't eligible|is not eligible|ineligible|don't allow|does not allow|doesn't allow|"
    r"against (our|the) policy|policy (does not|doesn't|won't)|i'm afraid|unfortunately|must decline|"
    r"have to decline|not something i can)\b"
)
DONE = re.compile(
    r"\b(done|completed?|successful(ly)?|has been|have been|is now|are now|was (cancel|process|updat|"
    r"submit|sent|chang|modif|return|exchang|book|add|suspend|resum|enabl)\w*|i('ve| have) "
    r"(cancel|process|updat|submit|sent|chang|modif|return|exchang|book|add|suspend|resum|enabl|refuel|"
    r"request|issu|credit)\w*|all set|went through|confirmed)\b"
)
FAILED = re.compile(r"\b(error|failed|fail|could not|couldn't|was not able|wasn't able|did not go through|"
                    r"didn't go through|went wrong|problem (with|processing))\b")
ANYTHING_ELSE = re.compile(r"\banything else\b|\bsomething else\b|\bother (request|question)s?\b|"
                           r"\bhow (can|may) i help\b|\bwhat can i do for you\b|\bhow can i assist\b|"
                           r"\bwhat (do|would) you (need|like)\b|\bhelp you (with )?today\b")
TRANSFER = re.compile(r"\btransfer(ring|red)? (you|your call|the call|this)\b|\b(connect|hand) you (over )?"
                      r"(to|with) (a |an )?(human|live|specialist|colleague|agent|representative)|"
                      r"\bhuman (agent|representative)\b.*\b(now|shortly|will)\b")
NOT_TRANSFER = re.compile(r"\b(can ?not|can't|won't|will not|don't|do not|unable to) (transfer|connect)")
#: a sentence in which the agent talks about what *it* does, not what it asks the user to do
SELF_TALK = re.compile(r"^(i|i'll|i've|i'm|i will|i have|i can|i could|let me|we|we'll|we've)\b|"
                       r"\b(shall|should|can|may) i\b|\bwould you like me\b|\bwant me to\b")


# -- what the user may be saying: one yes/no vocabulary ------------------------------------------------------
# Read by the judge (a write needs an explicit yes: muarl.rewards), by the scripted agents (muarl.policies.script)
# and by the slip checks (a repeat that says yes or no to a proposal made again answers it: muarl.users.slips),
# so that "yes" means the same to all three.
#: words that say yes wherever they stand in a reply ("Yes, please go ahead.", "That's correct, do it.")
YES_WORDS = (r"yes|yeah|yep|yup|confirm(?:ed|s)?|go ahead|proceed|please do|do it|do that|that'?s right|correct|"
             r"sounds good|absolutely|of course|approved?|agreed?")
#: agreement that is a yes only when it is (nearly) the whole reply ("Okay." yes; "Okay, I did that" no)
WEAK_YES_WORDS = r"ok|okay|sure|alright|all right|fine"
#: how a reply that says no (or stops the agent) opens
NO_OPENINGS = r"no|nope|nah|not quite|that'?s not|that is not|wait|hold on|stop"
#: a negation or hedge anywhere, which takes any yes back ("that's not correct", "actually, rather the blue one")
NEGATION = r"not|don'?t|do not|doesn'?t|isn'?t|never|wrong|hold on|wait|instead|rather|changed? my mind"
#: replies that hold a "no" and say nothing against the proposal
POLITE_NO = re.compile(r"\b(no|not a) (problem|worries)\b", re.IGNORECASE)
#: the most words a reply made of a weak yes may have
WEAK_YES_LENGTH = 6

YES = re.compile(rf"\b({YES_WORDS})\b", re.IGNORECASE)
WEAK_YES = re.compile(rf"\b({WEAK_YES_WORDS})\b", re.IGNORECASE)
NEGATED = re.compile(rf"^\W*({NO_OPENINGS})\b|\b({NEGATION})\b", re.IGNORECASE)
OPENS_YES = re.compile(rf"^\W*({YES_WORDS}|{WEAK_YES_WORDS}|please (?:go ahead|proceed))\b", re.IGNORECASE)
OPENS_NO = re.compile(rf"^\W*({NO_OPENINGS})\b", re.IGNORECASE)


def says_yes(text: str) -> bool:
    """Whether a user message explicitly says yes: a yes word, or a weak one in a short reply, and no
    negation or hedge anywhere. Deliberately strict: it licenses a write (``muarl.rewards.is_confirmation``)."""
    if NEGATED.search(POLITE_NO.sub("", text)):
        return False
    return bool(YES.search(text)) or (bool(WEAK_YES.search(text)) and len(text.split()) <= WEAK_YES_LENGTH)


def opens_with_yes_or_no(text: str) -> bool:
    """Whether a reply opens with a yes or a no (of the same words): an answer to a proposal, whichever it is."""
    return bool(OPENS_YES.search(text) or OPENS_NO.search(text))
