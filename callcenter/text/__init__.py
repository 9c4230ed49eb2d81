"""Text grammars shared by hearing and dialog (spoken digit strings)."""
