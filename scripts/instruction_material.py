"""Seed material for scripts/make_instruction_prompts.py: topics, characters, real-world lists
(countries, cities, books, people, phenomena, devices, concept pairs, terms), hand-written
sentences in six languages, review phrases, customer messages, coding tasks and snippets, and the
name parts and slot values of the fictional fact records that the builder renders as passages.

Plain data only. The builder reserves every 8th entry of most lists (index % 8 == 5) for the
held-out "outside" evaluation set, so entries may be appended but not reordered without
changing both sets.
"""

# ---------------------------------------------------------------------------------------------
# Topics (advice, explanations, creative writing, open chat)
# ---------------------------------------------------------------------------------------------
TOPICS = [
    "photosynthesis", "black holes", "plate tectonics", "the water cycle", "vaccines",
    "climate change", "DNA", "the immune system", "volcanoes", "ocean tides", "renewable energy",
    "electric cars", "quantum computing", "machine learning", "the solar system", "earthquakes",
    "antibiotics", "evolution", "coral reefs", "rainforests", "sleep", "nutrition", "strength training",
    "stress", "meditation", "budgeting", "saving for retirement", "baking bread", "cooking rice",
    "vegetable gardening", "houseplants", "composting", "recycling", "public transport",
    "moving to a new city", "job interviews", "remote work", "time management",
    "learning a second language", "studying for exams", "public speaking", "writing a resume",
    "negotiating a salary", "buying a first home", "renting an apartment", "raising a puppy",
    "caring for a cat", "birdwatching", "hiking", "camping", "training for a marathon", "yoga",
    "cycling to work", "chess", "photography", "watercolor painting", "learning the guitar",
    "starting a podcast", "video game design", "board games", "volunteering", "making friends as an adult",
    "parenting toddlers", "teenagers and social media", "online privacy", "password security",
    "phishing emails", "cloud storage", "smartphone batteries", "3D printing", "drones",
    "smart home devices", "electric bikes", "solar panels", "home insulation", "minimalism",
    "fast fashion", "coffee", "tea", "chocolate", "street food", "vegetarian cooking", "food waste",
    "farmers markets", "beekeeping", "urban farming", "wind turbines", "nuclear power",
    "space tourism", "the Moon landing", "the printing press", "the Roman Empire", "ancient Egypt",
    "the Silk Road", "the Industrial Revolution", "the Renaissance", "jazz", "hip hop",
    "classical music", "silent films", "comic books", "poetry", "public libraries", "museums",
    "the Olympic Games", "soccer", "basketball", "tennis", "swimming", "mountain climbing",
    "sourdough starters", "fermentation", "spices", "the history of pizza", "honeybees", "octopuses",
    "whales", "migratory birds", "desert ecosystems", "glaciers", "air pollution", "clean water",
    "hand washing", "first aid", "dental hygiene", "posture", "hydration", "screen time",
    "reading habits", "journaling", "procrastination", "motivation", "habit building",
    "decision making", "critical thinking", "conflict at work", "giving feedback", "team meetings",
    "small business marketing", "customer service", "online shopping", "credit cards",
    "student loans", "inflation", "interest rates", "the stock market", "cryptocurrency",
    "open source software", "version control", "cybersecurity", "data visualization",
    "spreadsheets", "typing speed", "touch typing", "ergonomics", "standing desks",
    "city parks", "bicycle lanes", "tiny houses", "road trips", "train travel", "packing light",
    "jet lag", "travel insurance", "learning to swim", "knitting", "woodworking", "pottery",
    "origami", "magic tricks", "stand-up comedy", "theater", "opera", "ballet", "street art",
    "architecture", "bridges", "skyscrapers", "lighthouses", "maps", "compasses", "clocks",
    "calendars", "the metric system", "prime numbers", "probability", "statistics", "geometry",
    "the Fibonacci sequence", "logic puzzles", "memory techniques", "speed reading", "dyslexia",
    "sign language", "bilingual children", "grandparents", "family traditions", "wedding planning",
    "birthday parties", "holiday gifts", "thank-you notes", "good manners", "tipping",
]

CHARACTERS = [
    "a lighthouse keeper", "a lost robot", "a retired astronaut", "a shy dragon", "a street musician",
    "a baker who cannot taste", "a detective cat", "a time-traveling librarian", "a young inventor",
    "an old fisherman", "a talking tree", "a nervous substitute teacher", "a ghost who loves jazz",
    "a mail carrier on Mars", "twin sisters", "a chess champion", "a forgetful wizard",
    "a penguin who wants to fly", "a night-shift nurse", "a mountain guide", "a city pigeon",
    "a beekeeper", "a clockmaker", "a runaway kite", "a grumpy cloud", "a deep-sea diver",
    "a small-town mayor", "a museum guard", "a retired circus elephant", "a teenage coder",
    "a traveling tailor", "an android learning to cook", "a lonely satellite", "a fox and a crow",
    "a girl who collects maps", "a firefighter", "a farmer during a drought", "a violin maker",
    "a boy and his grandmother", "a knight afraid of the dark",
]

# ---------------------------------------------------------------------------------------------
# Real-world lists (closed-book QA, travel, comparisons)
# ---------------------------------------------------------------------------------------------
COUNTRIES = [
    "France", "Japan", "Brazil", "Canada", "Kenya", "Australia", "Egypt", "Norway", "Mexico",
    "India", "Argentina", "Italy", "Germany", "Spain", "Portugal", "Thailand", "Vietnam", "Peru",
    "Chile", "Morocco", "Nigeria", "Ghana", "South Korea", "Indonesia", "Turkey", "Greece",
    "Poland", "Sweden", "Finland", "Ireland", "New Zealand", "Colombia", "Ethiopia", "Iceland",
    "the Netherlands", "Switzerland", "Austria", "Hungary", "Czechia", "Malaysia", "the Philippines",
    "Pakistan", "Bangladesh", "Nepal", "Mongolia", "Cuba", "Jamaica", "Senegal", "Tanzania", "Uruguay",
]

CITIES = [
    "Lisbon", "Kyoto", "Mexico City", "Cape Town", "Vancouver", "Istanbul", "Prague", "Hanoi",
    "Buenos Aires", "Edinburgh", "Marrakesh", "Seoul", "Melbourne", "Copenhagen", "Lima",
    "Budapest", "Barcelona", "Montreal", "Nairobi", "Singapore", "Reykjavik", "Vienna", "Oaxaca",
    "Krakow", "Porto", "Osaka", "Cartagena", "Tbilisi", "Zanzibar", "Ljubljana", "Chicago",
    "New Orleans", "Dublin", "Amsterdam", "Athens", "Bangkok", "Taipei", "Santiago", "Quebec City",
    "Valencia", "Florence", "Seville", "Hamburg", "Helsinki", "Tallinn", "Bergen", "Queenstown",
]

BOOKS = [
    ("Pride and Prejudice", "Jane Austen"), ("Moby-Dick", "Herman Melville"),
    ("One Hundred Years of Solitude", "Gabriel Garcia Marquez"), ("1984", "George Orwell"),
    ("Things Fall Apart", "Chinua Achebe"), ("The Great Gatsby", "F. Scott Fitzgerald"),
    ("War and Peace", "Leo Tolstoy"), ("Don Quixote", "Miguel de Cervantes"),
    ("Frankenstein", "Mary Shelley"), ("The Odyssey", "Homer"), ("Jane Eyre", "Charlotte Bronte"),
    ("To Kill a Mockingbird", "Harper Lee"), ("The Little Prince", "Antoine de Saint-Exupery"),
    ("Crime and Punishment", "Fyodor Dostoevsky"), ("Beloved", "Toni Morrison"),
    ("The Hobbit", "J. R. R. Tolkien"), ("Dracula", "Bram Stoker"),
    ("The Metamorphosis", "Franz Kafka"), ("Wuthering Heights", "Emily Bronte"),
    ("Brave New World", "Aldous Huxley"), ("The Catcher in the Rye", "J. D. Salinger"),
    ("Little Women", "Louisa May Alcott"), ("The Old Man and the Sea", "Ernest Hemingway"),
    ("Great Expectations", "Charles Dickens"), ("Anna Karenina", "Leo Tolstoy"),
    ("The Divine Comedy", "Dante Alighieri"), ("Les Miserables", "Victor Hugo"),
    ("The Count of Monte Cristo", "Alexandre Dumas"), ("Middlemarch", "George Eliot"),
    ("Fahrenheit 451", "Ray Bradbury"),
]

PEOPLE = [
    "Marie Curie", "Isaac Newton", "Ada Lovelace", "Nelson Mandela", "Leonardo da Vinci",
    "Frida Kahlo", "Albert Einstein", "Rosalind Franklin", "Mahatma Gandhi", "Galileo Galilei",
    "Wolfgang Amadeus Mozart", "Cleopatra", "Charles Darwin", "Nikola Tesla", "Harriet Tubman",
    "Confucius", "Alan Turing", "Amelia Earhart", "Florence Nightingale", "Ibn Battuta",
    "Katherine Johnson", "Louis Pasteur", "Sejong the Great", "Simon Bolivar", "Hypatia",
    "Johann Sebastian Bach", "Jane Goodall", "Martin Luther King Jr.", "Genghis Khan", "Gregor Mendel",
]

PHENOMENA = [
    "rainbows", "the seasons", "thunder", "ocean waves", "auroras", "fog", "hiccups", "yawning",
    "jet lag", "tides", "rust", "static electricity", "bread rising", "ice floating on water",
    "leaves changing color in autumn", "the sky being blue", "sunsets being red", "echoes",
    "sneezing", "goosebumps", "muscle cramps", "inflation", "traffic jams", "wrinkled fingers in water",
    "cats purring", "birds migrating", "bubbles being round", "popcorn popping", "onions making people cry",
    "metal feeling colder than wood", "stars twinkling", "the Moon's phases", "earthquakes", "lightning",
]

DEVICES = [
    "a refrigerator", "a microwave oven", "GPS", "Wi-Fi", "a solar panel", "a touchscreen",
    "a lithium-ion battery", "a credit score", "compound interest", "a search engine",
    "noise-cancelling headphones", "a 3D printer", "an elevator", "an airplane wing", "a vaccine",
    "a heat pump", "a camera lens", "an electric motor", "a barcode scanner", "a thermostat",
    "public-key encryption", "a hash table", "a blockchain", "a compiler", "a web browser",
    "an induction stove", "a smoke detector", "a hybrid car", "a bicycle gear system", "a piano",
    "a dishwasher", "a QR code", "Bluetooth", "a wind turbine", "a water filter", "a pressure cooker",
]

CONCEPT_PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "storage"), ("stocks", "bonds"),
    ("a crocodile", "an alligator"), ("empathy", "sympathy"), ("speed", "velocity"),
    ("a hurricane", "a tornado"), ("baking soda", "baking powder"), ("a CV", "a resume"),
    ("affect", "effect"), ("HTTP", "HTTPS"), ("a simile", "a metaphor"), ("mass", "weight"),
    ("a debit card", "a credit card"), ("a lake", "a pond"), ("an LLC", "a corporation"),
    ("a list", "a tuple in Python"), ("a psychologist", "a psychiatrist"), ("frogs", "toads"),
    ("a comet", "an asteroid"), ("renting", "buying a home"), ("cardio", "strength training"),
    ("a latte", "a cappuccino"), ("a vegan diet", "a vegetarian diet"), ("TCP", "UDP"),
    ("machine learning", "traditional programming"), ("a republic", "a democracy"),
    ("an essay", "a report"), ("a fruit", "a vegetable"), ("a mutual fund", "an index fund"),
    ("SQL", "NoSQL databases"), ("a sprain", "a strain"), ("a tablet", "a laptop"),
    ("nuclear fission", "nuclear fusion"), ("an ocean", "a sea"), ("a violin", "a viola"),
    ("a cold", "the flu"), ("dew", "frost"), ("a recession", "a depression"),
]

TERMS = [
    "opportunity cost", "photosynthesis", "entropy", "a haiku", "a sonnet", "cognitive dissonance",
    "supply and demand", "a black hole", "an API", "a neural network", "biodiversity", "inflation",
    "the greenhouse effect", "a placebo", "irony", "an algorithm", "a recession", "osmosis",
    "a carbon footprint", "the scientific method", "a budget deficit", "plate tectonics",
    "a metaphor", "gross domestic product", "a firewall", "a cache", "an ecosystem", "a mortgage",
    "a dividend", "the golden ratio", "a palindrome", "an allergy", "a gene", "a democracy",
    "a sonnet's volta", "a food chain", "a prime number", "a derivative in calculus", "a vector",
    "the placebo effect", "confirmation bias", "a startup", "a podcast", "open source",
]

LANGUAGES = [
    "French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese",
    "Korean", "Russian", "Arabic", "Hindi", "Turkish", "Swedish", "Polish", "Greek",
]

# ---------------------------------------------------------------------------------------------
# Hand-written sentences (translation, rewriting, classification)
# ---------------------------------------------------------------------------------------------
EN_SENTENCES = [
    "Where is the nearest train station?",
    "I would like to book a table for two at eight o'clock.",
    "The museum is closed on Mondays.",
    "Could you please speak a little more slowly?",
    "My brother works as a nurse in a large hospital.",
    "We are planning a picnic by the lake this weekend.",
    "The weather forecast says it will rain tomorrow afternoon.",
    "I have been learning to play the piano for three years.",
    "How much does this jacket cost?",
    "Please turn off the lights when you leave the room.",
    "The meeting has been moved to Thursday morning.",
    "She reads a new book every week.",
    "Our flight was delayed because of the storm.",
    "Can you recommend a good restaurant near the hotel?",
    "The children are playing football in the park.",
    "I forgot my umbrella at the office.",
    "This soup is delicious, but it is a little too salty.",
    "The library opens at nine and closes at six.",
    "He has lived in this village all his life.",
    "Thank you very much for your help yesterday.",
    "We need to buy bread, milk and eggs.",
    "The new bridge will be finished next spring.",
    "My phone battery is almost empty.",
    "Do you know where I can find a pharmacy?",
    "The concert starts in twenty minutes.",
    "I am allergic to peanuts.",
    "It takes about an hour to drive to the airport.",
    "Our teacher gave us a lot of homework today.",
    "The garden is full of flowers in May.",
    "Please send me the report before Friday.",
    "I prefer tea to coffee in the morning.",
    "The cat is sleeping on the windowsill.",
    "Could I have the bill, please?",
    "We visited my grandparents during the holidays.",
    "The store is having a sale on winter coats.",
    "He missed the bus and had to walk to school.",
    "Learning a new language takes patience and practice.",
    "The hotel room has a beautiful view of the sea.",
    "I will call you as soon as I arrive.",
    "The price of vegetables has gone up this year.",
    "Exercise is good for both the body and the mind.",
    "They opened a small bakery on the corner of our street.",
    "My favorite season is autumn because of the colors.",
    "The doctor told me to drink more water.",
    "Is there a bank near here?",
    "The train to the city leaves every fifteen minutes.",
    "She painted the kitchen bright yellow.",
    "We should leave early to avoid the traffic.",
    "Happy birthday! I hope all your wishes come true.",
    "The instructions are printed on the back of the box.",
]

FOREIGN_SENTENCES = {
    "Spanish": [
        "Me gustaría reservar una habitación para dos noches.",
        "¿Dónde está la biblioteca más cercana?",
        "Mañana vamos a visitar a mis abuelos en el campo.",
        "El tren sale a las siete y media de la mañana.",
        "No me gusta el café sin azúcar.",
        "Mi hermana estudia medicina en la universidad.",
        "¿Puedes ayudarme a llevar estas cajas?",
        "Hace mucho calor hoy, vamos a la playa.",
        "El restaurante está cerrado los domingos.",
        "Estoy aprendiendo a tocar la guitarra.",
        "La reunión empezará dentro de diez minutos.",
        "Perdí mis llaves en el parque ayer.",
        "Los niños están jugando en el jardín.",
        "¿Cuánto cuesta un billete de ida y vuelta?",
        "Nos vemos el viernes en la estación.",
        "Me encanta leer novelas de misterio antes de dormir.",
        "Necesito comprar un regalo para mi madre.",
        "El museo tiene una exposición nueva sobre el mar.",
        "Por favor, cierra la ventana, hace frío.",
        "Trabajo desde casa tres días a la semana.",
    ],
    "French": [
        "Je voudrais un café et un croissant, s'il vous plaît.",
        "Où se trouve la gare la plus proche ?",
        "Nous partons en vacances à la montagne cet été.",
        "Il pleut depuis ce matin.",
        "Mon frère travaille dans une petite boulangerie.",
        "Pouvez-vous répéter plus lentement, s'il vous plaît ?",
        "Le magasin ouvre à neuf heures.",
        "J'ai oublié mon parapluie dans le bus.",
        "Les enfants jouent dans le jardin.",
        "Elle apprend le japonais depuis deux ans.",
        "La réunion a été reportée à jeudi.",
        "Combien coûte ce livre ?",
        "Nous avons visité un musée très intéressant hier.",
        "Il fait trop chaud pour courir aujourd'hui.",
        "Je cherche un appartement près du centre-ville.",
        "Le dîner sera prêt dans vingt minutes.",
        "Merci beaucoup pour votre aide.",
        "Mon téléphone ne marche plus.",
        "Le film commence à huit heures et demie.",
        "Nous devons acheter du pain et du fromage.",
    ],
    "German": [
        "Ich hätte gern ein Glas Wasser, bitte.",
        "Wo ist der nächste Supermarkt?",
        "Morgen fahren wir mit dem Zug nach Berlin.",
        "Das Wetter ist heute sehr schön.",
        "Meine Schwester arbeitet als Lehrerin.",
        "Können Sie mir bitte helfen?",
        "Der Bus kommt in fünf Minuten.",
        "Ich lerne seit einem Jahr Spanisch.",
        "Das Museum ist montags geschlossen.",
        "Wir haben am Wochenende einen Ausflug gemacht.",
        "Wie viel kostet diese Jacke?",
        "Die Kinder spielen im Park Fußball.",
        "Ich habe meinen Schlüssel verloren.",
        "Das Konzert beginnt um acht Uhr.",
        "Bitte schließen Sie die Tür.",
        "Mein Großvater erzählt gern Geschichten.",
    ],
    "Italian": [
        "Vorrei prenotare un tavolo per quattro persone.",
        "Dov'è la fermata dell'autobus?",
        "Oggi fa molto freddo.",
        "Mia madre cucina la pasta ogni domenica.",
        "Il treno è in ritardo di venti minuti.",
        "Studio l'italiano da sei mesi.",
        "Quanto costa questo biglietto?",
        "Domani andiamo al mare con gli amici.",
        "Il negozio chiude alle sette di sera.",
        "Grazie mille per il regalo.",
    ],
    "Portuguese": [
        "Eu gostaria de um suco de laranja, por favor.",
        "Onde fica o hotel mais próximo?",
        "Vamos ao cinema amanhã à noite.",
        "Minha avó mora numa cidade pequena.",
        "O mercado abre às oito horas.",
        "Estou aprendendo a nadar.",
        "Está chovendo muito hoje.",
        "Quanto custa esta camisa?",
        "Nós jantamos juntos todas as sextas-feiras.",
        "O livro está em cima da mesa.",
    ],
}

CASUAL_MESSAGES = [
    "hey can u send me the notes from yesterdays class i missed it cuz i was sick",
    "i cant make it to the meeting tmrw, something came up, sorry!!",
    "the printer on the 2nd floor is broken again, someone should call IT",
    "we r out of coffee in the kitchen, whos turn is it to buy",
    "just checking if ur still ok to pick up the kids at 5",
    "lol that movie was so bad but i kinda loved it",
    "the report is late bc the data came in late, will send it monday",
    "dont forget mom's birthday is on saturday, we need a gift",
    "can we push our call to 3 instead of 2? running behind",
    "the wifi at the hotel keeps dropping, so annoying",
    "thx for dinner last night, it was amazing",
    "is the gym open on holidays or no",
    "my laptop died and i lost like half my essay",
    "the new guy in accounting seems nice, we should invite him to lunch",
    "reminder that rent is due on the 1st, pls dont be late again",
    "i think we should redo the slides, they look kinda messy",
]

REVIEW_POSITIVE = [
    "works exactly as described", "arrived two days early", "the battery lasts all day",
    "the staff were incredibly friendly", "worth every penny", "easy to set up in minutes",
    "the food was fresh and full of flavor", "feels solid and well made", "my kids love it",
    "the instructions were clear", "it is much quieter than my old one", "great value for the price",
    "the room was spotless", "customer support solved my problem quickly", "comfortable to wear all day",
]
REVIEW_NEGATIVE = [
    "stopped working after a week", "the package arrived damaged", "the battery drains overnight",
    "the waiter ignored us for twenty minutes", "way too expensive for what you get",
    "the app keeps crashing", "the soup was cold", "feels cheap and flimsy", "the color faded after one wash",
    "the instructions made no sense", "it is louder than a lawnmower", "the room smelled of smoke",
    "support never answered my emails", "the zipper broke on the first day", "it is smaller than the photos suggest",
]

CUSTOMER_INTENTS = {
    "refund request": ["I want my money back for order {n}, the item never worked.",
                       "Please refund my last payment, I was charged twice."],
    "cancel subscription": ["How do I cancel my monthly plan? I don't use it anymore.",
                            "Please stop my subscription starting next month."],
    "track order": ["Where is my package? Order {n} was supposed to arrive on Tuesday.",
                    "Can you tell me when order {n} will be delivered?"],
    "change address": ["I moved last week, can you update the shipping address on my account?",
                       "Please send order {n} to my new address instead."],
    "technical problem": ["The app logs me out every time I open it.",
                          "I can't reset my password, the email never arrives."],
    "product question": ["Does this blender come with a glass jar or a plastic one?",
                         "Is the jacket waterproof or only water resistant?"],
    "complaint": ["Your delivery driver left my parcel in the rain. Everything is soaked.",
                  "I've waited on hold for an hour three days in a row. This is unacceptable."],
    "compliment": ["Just wanted to say your support team was fantastic yesterday!",
                   "The new update is great, the app feels so much faster."],
}

ITEM_GROUPS = {
    ("fruit", "vegetable"): (["apple", "mango", "banana", "cherry", "pear", "kiwi", "plum", "grape"],
                             ["carrot", "spinach", "broccoli", "onion", "potato", "cabbage", "leek", "kale"]),
    ("mammal", "bird", "reptile"): (["dolphin", "bat", "otter", "camel", "rabbit"],
                                    ["sparrow", "penguin", "owl", "ostrich", "parrot"],
                                    ["gecko", "iguana", "python", "tortoise", "chameleon"]),
    ("renewable", "non-renewable"): (["solar power", "wind power", "hydropower", "geothermal energy"],
                                     ["coal", "natural gas", "oil", "uranium"]),
    ("string instrument", "wind instrument", "percussion"): (
        ["violin", "cello", "harp", "banjo"], ["flute", "oboe", "trumpet", "clarinet"],
        ["drum", "xylophone", "tambourine", "cymbal"]),
    ("input device", "output device"): (["keyboard", "mouse", "microphone", "scanner", "webcam"],
                                        ["monitor", "printer", "speaker", "projector", "headphones"]),
    ("solid", "liquid", "gas"): (["ice", "iron", "wood", "salt"], ["water", "honey", "oil", "milk"],
                                 ["steam", "oxygen", "helium", "carbon dioxide"]),
}

NEWS_CATEGORIES = ["politics", "sports", "technology", "health", "business", "science",
                   "entertainment", "weather", "education", "travel"]

# ---------------------------------------------------------------------------------------------
# Coding material
# ---------------------------------------------------------------------------------------------
PROGRAMMING_LANGUAGES = ["Python", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust",
                         "C#", "Ruby", "Kotlin", "Swift", "PHP", "Bash"]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "merges two sorted lists into one sorted list",
    "counts how often each word appears in a text", "returns the n-th Fibonacci number",
    "removes duplicates from a list while keeping the order", "checks whether a string is a palindrome",
    "finds the largest element in an array", "converts Celsius to Fahrenheit",
    "computes the factorial of a number iteratively", "flattens a nested list",
    "validates an email address with a simple rule", "returns the second largest number in a list",
    "computes the greatest common divisor of two integers", "splits a list into chunks of size n",
    "checks whether two strings are anagrams", "rotates a matrix by 90 degrees",
    "finds the first non-repeating character in a string", "implements binary search on a sorted array",
    "capitalizes the first letter of every word", "sums the digits of an integer",
    "converts a Roman numeral to an integer", "converts an integer to binary without built-ins",
    "counts the vowels in a string", "returns all pairs of numbers that add up to a target",
    "checks whether parentheses in a string are balanced", "computes the average of a list, ignoring None values",
    "reads a CSV file and prints the number of rows", "groups a list of words by their first letter",
    "implements a stack with push, pop and peek", "implements a queue using two stacks",
    "finds the longest common prefix of a list of strings", "computes the median of a list",
    "generates all permutations of a string", "checks whether a year is a leap year",
    "computes the running total of a list", "truncates a string to n characters and adds an ellipsis",
    "returns the intersection of two lists", "converts a snake_case string to camelCase",
    "counts the lines in a text file", "finds the most common element in a list",
    "removes all whitespace from a string", "checks whether a list is sorted",
    "computes compound interest given principal, rate and years", "shuffles a list in place (Fisher-Yates)",
    "implements a simple LRU cache", "parses a query string like a=1&b=2 into a dictionary",
    "returns the number of days between two dates", "implements bubble sort",
    "implements merge sort", "finds the missing number in a list containing 1 to n",
    "checks whether a number is a power of two", "converts a list of key-value pairs to a dictionary",
    "masks all but the last four digits of a credit card number", "generates a random password of a given length",
    "computes the area of a circle given its radius", "transposes a 2D list",
    "finds all prime numbers below n with the sieve of Eratosthenes", "reverses the words in a sentence",
    "validates that a string contains only digits", "returns the Levenshtein distance between two strings",
    "formats a number of seconds as HH:MM:SS", "deep-copies a nested dictionary without libraries",
    "debounces a function call", "retries a function up to three times when it raises an error",
    "counts the number of set bits in an integer", "checks whether a linked list has a cycle",
    "computes the dot product of two vectors", "returns the k largest elements of a list",
]

CODE_SNIPPETS = [
    "def f(xs):\n    out = []\n    for x in xs:\n        if x % 2 == 0:\n            out.append(x * x)\n    return out",
    "def g(s):\n    return s == s[::-1]",
    "def total(prices, tax):\n    s = 0\n    for p in prices:\n        s += p\n    return s * 1 + tax",
    "def find(items, target):\n    lo, hi = 0, len(items)\n    while lo < hi:\n        mid = (lo + hi) // 2\n        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid\n    return lo",
    "def count_words(text):\n    counts = {}\n    for w in text.split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts",
    "def avg(nums):\n    return sum(nums) / len(nums)",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)",
    "def dedupe(xs):\n    seen = set()\n    return [x for x in xs if not (x in seen or seen.add(x))]",
    "def last(xs):\n    return xs[len(xs)]",
    "def merge(a, b):\n    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]",
    "def is_prime(n):\n    for d in range(2, n):\n        if n % d == 0:\n            return False\n    return True",
    "def add_item(item, basket=[]):\n    basket.append(item)\n    return basket",
    "import json\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)",
    "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]",
    "def max_index(xs):\n    best = 0\n    for i in range(1, len(xs)):\n        if xs[i] > xs[best]:\n            best = i\n    return best",
    "function sum(arr) {\n  let s = 0;\n  for (let i = 0; i <= arr.length; i++) {\n    s += arr[i];\n  }\n  return s;\n}",
    "const unique = (arr) => [...new Set(arr)];",
    "int square(int x) {\n    return x * x;\n}",
    "SELECT name, COUNT(*)\nFROM orders\nGROUP BY customer_id;",
    "for i in range(10):\n    if i % 3 == 0:\n        continue\n    print(i)",
    "def celsius(f):\n    return (f - 32) * 5 / 9",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def inc(self):\n        self.n += 1\n        return self.n",
    "def words_longer_than(text, k):\n    return [w for w in text.split() if len(w) > k]",
    "while True:\n    line = input()\n    if line == 'quit':\n        break\n    print(line.upper())",
]

SQL_TABLES = [
    ("employees", ["id", "name", "department", "salary", "hire_date"]),
    ("orders", ["order_id", "customer_id", "amount", "status", "created_at"]),
    ("books", ["isbn", "title", "author", "year", "price"]),
    ("students", ["student_id", "name", "grade", "class", "enrolled_on"]),
    ("flights", ["flight_no", "origin", "destination", "departure", "seats_left"]),
    ("products", ["sku", "name", "category", "price", "stock"]),
    ("patients", ["patient_id", "name", "birth_date", "ward", "admitted_on"]),
    ("rentals", ["rental_id", "bike_id", "station", "minutes", "started_at"]),
]

# ---------------------------------------------------------------------------------------------
# Names for fictional entities
# ---------------------------------------------------------------------------------------------
FIRST_NAMES = [
    "Mara", "Tomas", "Aisha", "Kenji", "Lucia", "Oluwaseun", "Priya", "Anders", "Mei", "Rafael",
    "Ingrid", "Kofi", "Sofia", "Dmitri", "Leila", "Mateo", "Hana", "Samuel", "Yara", "Arjun",
    "Elena", "Jonas", "Amara", "Luca", "Nadia", "Omar", "Chloe", "Viktor", "Zainab", "Felix",
    "Rosa", "Tariq", "Greta", "Daniel", "Imani", "Hugo", "Keiko", "Bruno", "Lina", "Marcus",
    "Ayla", "Pedro", "Freya", "Malik", "Clara", "Ivan", "Noor", "Elias", "Sana", "Diego",
]
LAST_NAMES = [
    "Okafor", "Lindqvist", "Tanaka", "Moreau", "Castillo", "Novak", "Haddad", "Brennan", "Sato",
    "Fischer", "Mensah", "Rossi", "Kowalski", "Chen", "Alvarez", "Petrov", "Nakamura", "Dubois",
    "Osei", "Larsen", "Gupta", "Silva", "Andersen", "Kaya", "Murphy", "Varga", "Ibrahim", "Costa",
    "Weber", "Park", "Ndiaye", "Horvat", "Quinn", "Santos", "Bauer", "Rahman", "Ferreira", "Holm",
    "Yilmaz", "Adeyemi", "Marsh", "Ortega", "Lund", "Kim", "Abara", "Vance", "Duarte", "Sorensen",
]
SYLLABLES_A = ["bren", "cal", "dor", "el", "fen", "gar", "hal", "is", "kel", "lor", "mar", "nor",
               "or", "pel", "quin", "ros", "sel", "tor", "ul", "vel", "wen", "yar", "zan", "ash",
               "bel", "cor", "dun", "ev", "fal", "hol"]
SYLLABLES_B = ["moor", "ford", "wick", "dale", "haven", "stead", "mere", "brook", "field", "port",
               "ridge", "vale", "holm", "by", "ton", "mouth", "crest", "wood", "gate", "shore"]
COMPANY_PREFIXES = ["Alta", "Brightline", "Corvid", "Daybreak", "Ember", "Fernway", "Granite",
                    "Harbor", "Ionic", "Juniper", "Kestrel", "Lumen", "Meridian", "Northwind",
                    "Orchid", "Pinecrest", "Quarry", "Redwood", "Silverleaf", "Tidewater",
                    "Umbra", "Vireo", "Willow", "Zephyr", "Ardent", "Bluefield", "Cobalt", "Driftwood"]
COMPANY_SUFFIXES = ["Systems", "Labs", "Foods", "Logistics", "Energy", "Robotics", "Textiles",
                    "Health", "Analytics", "Motors", "Games", "Pharma", "Outdoor", "Audio", "Bikes",
                    "Software", "Materials", "Farms", "Studios", "Water"]
COMPANY_PRODUCTS = {
    "Systems": "network routers", "Labs": "air-quality sensors", "Foods": "plant-based yogurts",
    "Logistics": "same-day delivery services", "Energy": "home battery packs",
    "Robotics": "warehouse robots", "Textiles": "recycled-fabric jackets", "Health": "telemedicine apps",
    "Analytics": "sales forecasting software", "Motors": "electric scooters", "Games": "puzzle games",
    "Pharma": "allergy medicines", "Outdoor": "ultralight tents", "Audio": "wireless earbuds",
    "Bikes": "cargo bicycles", "Software": "accounting tools", "Materials": "biodegradable packaging",
    "Farms": "vertical-farm lettuce", "Studios": "animated short films", "Water": "solar water purifiers",
}
REGIONS = ["the northern highlands", "the eastern coast", "the central valley", "the southern plains",
           "the western lakes district", "the river delta", "the island province", "the border hills"]
PROFESSIONS = ["architect", "marine biologist", "composer", "civil engineer", "pediatrician",
               "novelist", "astronomer", "chef", "software engineer", "historian", "photographer",
               "economist", "geologist", "choreographer", "veterinarian", "urban planner"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
INGREDIENTS = ["lentils", "chickpeas", "rice", "spinach", "tomatoes", "garlic", "onions", "ginger",
               "coconut milk", "potatoes", "carrots", "lemon", "cumin", "paprika", "feta", "eggs",
               "mushrooms", "zucchini", "black beans", "corn", "basil", "yogurt", "honey", "oats"]
DISHES = ["stew", "soup", "curry", "salad", "bake", "fritters", "risotto", "flatbread", "tacos", "pie"]
STUDY_INTERVENTIONS = [
    ("a ten-minute daily walk after lunch", "afternoon sleepiness"),
    ("reading aloud to children for twenty minutes a day", "vocabulary scores"),
    ("replacing sugary drinks with water", "blood sugar levels"),
    ("a weekly gardening class", "self-reported loneliness"),
    ("standing desks in offices", "lower back pain"),
    ("a phone-free hour before bed", "sleep quality"),
    ("short breathing exercises before exams", "test anxiety"),
    ("free bus passes for students", "school attendance"),
    ("planting trees along busy streets", "summer street temperatures"),
    ("a four-day school week", "teacher turnover"),
    ("daily vocabulary flashcards", "reading comprehension"),
    ("green roofs on apartment blocks", "indoor cooling costs"),
]
NEWS_EVENTS = ["bridge opening", "flood", "music festival", "local election", "product launch",
               "marathon", "library reopening", "factory closure", "heat wave", "science fair",
               "train strike", "new hospital wing"]
SPECIES_KINDS = [("frog", "wetlands", "insects"), ("beetle", "pine forests", "decaying wood"),
                 ("lizard", "rocky deserts", "ants"), ("songbird", "mountain meadows", "seeds"),
                 ("bat", "limestone caves", "moths"), ("orchid", "cloud forests", None),
                 ("crab", "mangrove swamps", "algae"), ("owl", "river valleys", "small rodents"),
                 ("butterfly", "coastal dunes", "flower nectar"), ("fish", "cold mountain streams", "larvae")]
HISTORY_KINDS = ["treaty", "expedition", "canal construction", "trade fair", "uprising", "university founding"]
