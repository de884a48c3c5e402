def unidecode(s):
    return s
