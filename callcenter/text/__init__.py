"""Text grammars shared by hearing and dialog (spoken digit strings), and phone numbers as written."""
