"""English irregular verbs: the forms a stemmer cannot join ("ran" / "run").

The porter tokenizer makes "hiking" and "hiked" one word, but not "went" and
"go": a question asks "When did Melanie run a race?" and the message says "I
ran a charity race".  So a search whose tokenizer stems English also looks for
a query verb's other forms (`other_forms`).  Verbs whose forms are all one
("put", "read") need nothing; verbs with a form that is a common word of its own
("left", "saw", "found", "felt", "bit", "rose", "bore", "bound") are left out (or
that form is), as it would match far more than the verb.
"""

from __future__ import annotations

# base, past, past participle ("-": the same as the past)
_VERBS = """
arise arose arisen  awake awoke awoken  beat beat beaten
become became become  begin began begun  bend bent -
bleed bled -  blow blew blown  break broke broken  breed bred -
bring brought -  build built -  burn burnt -  buy bought -  catch caught -
choose chose chosen  cling clung -  come came come  creep crept -  deal dealt -
dig dug -  do did done  draw drew drawn  dream dreamt -  drink drank drunk
drive drove driven  eat ate eaten  fall fell fallen  feed fed -  fight fought -
flee fled -  fling flung -  fly flew flown  forbid forbade forbidden
forget forgot forgotten  forgive forgave forgiven  freeze froze frozen  get got gotten
give gave given  go went gone  grow grew grown  hang hung -  have had -
hear heard -  hide hid hidden  hold held -  keep kept -  kneel knelt -
know knew known  lead led -  lean leant -  leap leapt -  learn learnt -
lend lent -  light lit -  lose lost -  make made -  mean meant -  meet met -
overcome overcame overcome  pay paid -  ride rode ridden  ring rang rung
run ran run  say said -  see - seen  seek sought -  sell sold -
send sent -  sew sewed sewn  shake shook shaken  shine shone -  shoot shot -
show showed shown  shrink shrank shrunk  sing sang sung  sink sank sunk
sit sat -  sleep slept -  slide slid -  speak spoke spoken  speed sped -
spend spent -  spin spun -  spit spat -  steal stole stolen  stick stuck -
sting stung -  stink stank stunk  strike struck -  swear swore sworn
sweep swept -  swim swam swum  swing swung -  take took taken  teach taught -
tear tore torn  tell told -  think thought -  throw threw thrown
understand understood -  wake woke woken  wear wore worn  weave wove woven
weep wept -  win won -  write wrote written  stand stood -
"""


def _table() -> dict[str, tuple[str, ...]]:
    forms: dict[str, tuple[str, ...]] = {}
    words = _VERBS.split()
    for start in range(0, len(words), 3):
        base, past, participle = words[start:start + 3]
        past = base if past == "-" else past
        participle = past if participle == "-" else participle
        group = tuple(dict.fromkeys((base, past, participle)))
        for form in group:
            forms[form] = tuple(other for other in group if other != form)
    return forms


_FORMS = _table()


def other_forms(word: str) -> tuple[str, ...]:
    """The other forms of the irregular verb WORD ("ran" -> ("run",)), or ()."""
    return _FORMS.get(word.casefold(), ())
