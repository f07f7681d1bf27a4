"""Write the model card (README.md) of a BiTA adapter folder from the training report in its bita.json.

Every figure on the card comes from that report (written by `draftverify train bita`); nothing is typed by hand.
Usage: python scripts/bita_card.py [zoo/code/bita]
"""
import sys

from draftverify.train.bita import write_card

print(write_card(sys.argv[1] if len(sys.argv) > 1 else "zoo/code/bita"))
