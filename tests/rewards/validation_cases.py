"""Hand-written prompts with good completions for the judge-validation tests (en and de)."""

from __future__ import annotations

GOOD = [
    ("en", "What is the boiling point of water at sea level?",
     "At sea level, water boils at 100 degrees Celsius, which is 212 degrees Fahrenheit. At higher altitudes the air "
     "pressure is lower, so water boils at a lower temperature. This is why pasta may take longer to cook in the mountains."),
    ("en", "How do I make a cup of black tea?",
     "Here is a simple method:\n1. Boil fresh water.\n2. Put one tea bag in a cup.\n3. Pour the water over it and wait "
     "about 3 minutes.\n4. Remove the bag and add milk if you like."),
    ("en", "Why is the sky blue?",
     "The sky looks blue because air molecules scatter short blue wavelengths of sunlight much more than long red ones. "
     "This effect is called Rayleigh scattering. At sunset the light travels through more air, so more blue is scattered "
     "away and the sky can look red or orange."),
    ("en", "What is 15% of 80?",
     "15% of 80 is 12. You can compute it as 0.15 times 80, or take 10% (8) and add 5% (4), which gives 12."),
    ("en", "Give me two tips for a job interview.",
     "Two tips that usually help:\n- Research the company, so you can explain why you want to work there.\n- Prepare short "
     "stories about past work that show the skills the job asks for."),
    ("en", "Who wrote Pride and Prejudice?",
     "Pride and Prejudice was written by Jane Austen. It was first published in 1813 and is one of the best known novels "
     "in English literature. It follows Elizabeth Bennet and her family."),
    ("en", "How many days are in a leap year?",
     "A leap year has 366 days instead of 365. The extra day is February 29. Leap years usually come every 4 years, "
     "so they keep the calendar in step with the seasons."),
    ("en", "What does a thermostat do?",
     "A thermostat keeps a room near a temperature you choose. It measures the temperature and switches the heating or "
     "cooling on when the room is too cold or too warm. Many modern thermostats can also follow a schedule."),
    ("de", "Wie viele Kontinente gibt es?",
     "Man zählt meist 7 Kontinente: Afrika, Antarktika, Asien, Australien, Europa, Nordamerika und Südamerika. In manchen "
     "Ländern werden Nord- und Südamerika als ein Kontinent gezählt. Dann sind es 6 Kontinente."),
    ("de", "Was ist die Hauptstadt von Italien?",
     "Die Hauptstadt von Italien ist Rom. Rom hat etwa 2,8 Millionen Einwohner. Die Stadt ist für ihre antiken Bauwerke "
     "bekannt, zum Beispiel das Kolosseum."),
    ("de", "Wie koche ich ein weiches Ei?",
     "So geht es:\n1. Wasser zum Kochen bringen.\n2. Das Ei vorsichtig hineinlegen.\n3. Etwa 5 Minuten kochen lassen.\n"
     "4. Das Ei kalt abschrecken und servieren."),
    ("de", "Warum ist Bewegung gesund?",
     "Regelmäßige Bewegung stärkt das Herz und den Kreislauf. Sie kann helfen, das Gewicht zu halten, und verbessert oft "
     "die Stimmung. Schon 30 Minuten zügiges Gehen an den meisten Tagen sind ein guter Anfang."),
]


def records(languages: tuple[str, ...] = ("en", "de")) -> list[dict]:
    return [
        {"id": f"{lang}-{n}", "language": lang, "messages": [{"role": "user", "content": question}], "completion": answer}
        for n, (lang, question, answer) in enumerate(GOOD)
        if lang in languages
    ]
