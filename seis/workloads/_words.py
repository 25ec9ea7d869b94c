"""Fixed word lists for the retrieval workload (no downloads; editing them changes the prepared data).

Filler words and key words are disjoint (and no key word is a substring of a filler word), so a needle's
key phrase occurs in its context exactly once. No list contains digits.
"""

from __future__ import annotations

FILLER_NOUNS: tuple[str, ...] = (
    "river", "garden", "village", "window", "teacher", "farmer", "market", "letter", "road", "mountain",
    "forest", "table", "kitchen", "library", "student", "bridge", "harbor", "valley", "field", "city",
    "station", "painter", "baker", "sailor", "museum", "lantern", "meadow", "cottage", "orchard", "notebook",
    "blanket", "carpet", "ladder", "basket", "bottle", "candle", "cupboard", "fountain", "hallway", "island",
    "journey", "message", "neighbor", "pathway", "shelter", "wagon", "traveler", "doctor", "musician", "clock",
)
FILLER_ADJECTIVES: tuple[str, ...] = (
    "quiet", "old", "small", "bright", "narrow", "warm", "busy", "gentle", "tall", "empty",
    "distant", "early", "simple", "careful", "heavy", "soft", "steady", "wide", "calm", "patient",
    "curious", "modest", "tired", "cheerful", "ordinary", "humble", "sturdy", "friendly", "lonely", "hidden",
)
FILLER_VERBS: tuple[str, ...] = (
    "walked", "waited", "rested", "looked", "moved", "stood", "turned", "drifted", "leaned", "wandered",
    "paused", "lingered", "settled", "traveled", "listened", "worked", "hurried", "returned", "watched", "stayed",
)
FILLER_PREPOSITIONS: tuple[str, ...] = (
    "near", "beside", "behind", "across", "toward", "under", "past", "around", "along", "through",
)
FILLER_TIMES: tuple[str, ...] = (
    "in the morning", "before noon", "after the rain", "during the long winter", "at dusk",
    "on a windy afternoon", "late in the evening", "early in the spring", "after supper", "all day",
)
FILLER_ADVERBS: tuple[str, ...] = (
    "Meanwhile", "Later", "Afterward", "Once again", "Slowly", "Eventually", "Without a word", "As usual",
)

KEY_ADJECTIVES: tuple[str, ...] = (
    "crimson", "amber", "cobalt", "ivory", "jade", "scarlet", "violet", "copper", "silver", "golden",
    "emerald", "indigo", "maroon", "ochre", "saffron", "bronze", "onyx", "coral", "azure", "lilac",
    "olive", "plum", "russet", "sable", "topaz", "umber", "velvet", "marble", "granite", "crystal",
)
KEY_NOUNS: tuple[str, ...] = (
    "falcon", "otter", "badger", "heron", "walrus", "panther", "beetle", "dolphin", "raven", "lynx",
    "gecko", "bison", "moose", "parrot", "salmon", "tiger", "viper", "weasel", "jaguar", "koala",
    "lemur", "marmot", "ocelot", "pelican", "quail", "robin", "stork", "toucan", "urchin", "zebra",
)
