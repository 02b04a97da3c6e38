"""The word lists every name and fact of the generated world is drawn from, and the year ranges.

    from xh.synth.words import CITY_PATTERNS, SURNAMES
    CITY_PATTERNS[1].format("Arden")    # 'Port Arden'

Lists that feed different kinds of names are kept disjoint (a test checks it), so that two
kinds can only share a title where the world reuses a name on purpose. Data only.
"""

FEMALE_FIRST_NAMES = (
    "Orla", "Mara", "Lena", "Ada", "Iris", "Nora", "Clara", "Elena", "Freya", "Greta",
    "Hanna", "Ines", "Julia", "Kira", "Lucia", "Maya", "Nadia", "Olga", "Petra", "Rosa",
    "Sara", "Tara", "Vera", "Wanda", "Yara", "Zoe", "Alma", "Beatrix", "Celia", "Dora",
    "Edith", "Fiona", "Gemma", "Helga", "Ida", "Jana", "Karin", "Lotte", "Mina", "Nell",
    "Paula", "Rhea", "Selma", "Thea", "Ulla", "Viola", "Agnes", "Bianca", "Carmen", "Daria",
    "Elsa", "Flora", "Gina", "Hedda", "Ilse", "Leah", "Maren", "Nina", "Odile", "Pia",
)
MALE_FIRST_NAMES = (
    "Aaron", "Bruno", "Caspar", "Dmitri", "Emil", "Felix", "Gustav", "Hugo", "Igor", "Jonas",
    "Karl", "Lars", "Magnus", "Nico", "Oskar", "Pavel", "Rafael", "Stefan", "Tobias", "Viktor",
    "Anton", "Bram", "Cyril", "Dario", "Elias", "Fabian", "Gideon", "Henrik", "Ivo", "Jasper",
    "Kai", "Leon", "Matteo", "Nils", "Otto", "Pieter", "Quentin", "Rolf", "Silas", "Theo",
    "Ulrich", "Vilem", "Walter", "Xavier", "Yannick", "Zoltan", "Adrian", "Bastian", "Conrad", "Dominik",
    "Erik", "Florian", "Georg", "Hector", "Ismael", "Julian", "Konrad", "Lukas", "Milo", "Oren",
)
FIRST_NAMES = FEMALE_FIRST_NAMES + MALE_FIRST_NAMES

SURNAMES = (
    "Brennan", "Quinn", "Hart", "Novak", "Keller", "Lindqvist", "Moreau", "Okafor", "Petrov", "Ramos",
    "Schmidt", "Tanaka", "Vidal", "Weber", "Yilmaz", "Zeller", "Abbott", "Barlow", "Castell", "Draper",
    "Ellery", "Fennell", "Garrow", "Halloran", "Ingram", "Jessop", "Kessler", "Lorimer", "Marchetti", "Nyberg",
    "Oakes", "Pruitt", "Quayle", "Rourke", "Sandoval", "Thorne", "Underhill", "Varga", "Whitlock", "Yates",
    "Aldous", "Becker", "Carver", "Dalton", "Esposito", "Farrow", "Gallagher", "Hennessy", "Ivanov", "Jansen",
    "Kowalski", "Larsen", "Mendez", "Nakamura", "Oliveira", "Pereira", "Quiroga", "Rossi", "Sorensen", "Tremblay",
    "Ueda", "Vasquez", "Wagner", "Xu", "Young", "Zimmer", "Achebe", "Bauer", "Coppola", "Duval",
    "Engel", "Fischer", "Gruber", "Hoffman", "Iqbal", "Jovanovic", "Kaur", "Lambert", "Moretti", "Nilsen",
    "Osei", "Pajari", "Rahman", "Sato", "Toivonen", "Umarov", "Valdez", "Wolff", "Yusuf", "Zamora",
    "Arnaud", "Berger", "Costa", "Dubois", "Eklund", "Ferreira", "Galli", "Haas", "Ibarra", "Jaramillo",
    "Kruger", "Lehmann", "Mancini", "Navarro", "Olsen", "Pavlov", "Renard", "Silva", "Takahashi", "Urban",
    "Vogel", "Winter", "Yamada", "Zito", "Asante", "Bianchi", "Conti", "Dimitrov", "Eriksen", "Fontaine",
    "Giordano", "Horvat", "Ionescu", "Jung", "Kovacs", "Lucas", "Marsh", "Nowak", "Ortega", "Pike",
    "Reyes", "Stone", "Tamura", "Ulloa", "Vance", "Walsh", "Yoon", "Zorn", "Ashdown", "Blake",
    "Crane", "Doyle", "Emery", "Frost", "Gage", "Hale", "Irwin", "Joyce", "Kemp", "Lowe",
    "Mercer", "Nash", "Orr", "Pryce", "Rowe", "Sykes", "Tate", "Voss", "Wren", "Yeats",
)

# City names: a stem from two syllables ("Ar" + "den") inside a pattern ("Port {}").
CITY_ONSETS = (
    "Ar", "Bel", "Cal", "Dun", "El", "Fal", "Gar", "Hal", "Ing", "Kel",
    "Lan", "Mar", "Nor", "Ol", "Pen", "Ros", "Sal", "Tor", "Ul", "Val",
    "Wes", "Ash", "Brom", "Carr", "Del", "Eb", "Fen", "Glen", "Hav", "Kin",
    "Lin", "Mel", "Ned", "Or", "Pel", "Rad", "Sel", "Tam", "Ver", "Wil",
)
CITY_ENDINGS = (
    "den", "ford", "mouth", "wick", "ley", "more", "ton", "bury", "field", "haven",
    "stead", "brook", "mere", "gate", "holm", "by", "worth", "ham", "dale", "burn",
    "croft", "hurst", "well", "stone", "moor", "bridge", "port", "shaw", "wood", "cliff",
)
CITY_PATTERNS = (
    "{}", "Port {}", "{} Falls", "New {}", "{} Springs", "Fort {}",
    "Lake {}", "{} Bay", "Mount {}", "{} Heights", "East {}", "{} Junction",
)
SETTLEMENT_TYPES = ("city", "town", "port city", "market town", "village")
RIVERS = ("Aune", "Vessa", "Tarn", "Lusk", "Orme", "Calder", "Wend", "Isel", "Maro", "Tessel")

# (country, demonym): real countries, invented cities.
COUNTRIES = (
    ("Ireland", "Irish"), ("Norway", "Norwegian"), ("Portugal", "Portuguese"), ("Canada", "Canadian"),
    ("Chile", "Chilean"), ("Austria", "Austrian"), ("Finland", "Finnish"), ("Greece", "Greek"),
    ("Kenya", "Kenyan"), ("Japan", "Japanese"), ("Poland", "Polish"), ("Scotland", "Scottish"),
    ("Brazil", "Brazilian"), ("Denmark", "Danish"), ("Hungary", "Hungarian"), ("Iceland", "Icelandic"),
    ("Mexico", "Mexican"), ("Peru", "Peruvian"), ("Belgium", "Belgian"), ("Estonia", "Estonian"),
)

OCCUPATIONS = (
    "architect", "painter", "novelist", "physicist", "composer", "journalist", "engineer", "actor",
    "singer", "photographer", "economist", "chemist", "historian", "poet", "sculptor", "politician",
    "mathematician", "cellist", "diplomat", "businessperson",
)

# Companies: "<surname or city stem> <suffix>"; the suffix fixes the industry.
COMPANY_SUFFIXES = (
    ("Motors", "automotive"), ("Airlines", "aviation"), ("Records", "music"),
    ("Pictures", "film production"), ("Pharmaceuticals", "pharmaceutical"), ("Foods", "food processing"),
    ("Steelworks", "steel"), ("Software", "software"), ("Shipping", "shipping"),
    ("Energy", "energy"), ("Publishing", "publishing"), ("Textiles", "textile"),
)
UNIVERSITY_PATTERNS = ("University of {}", "{} State University", "{} Institute of Technology", "{} College")

# Films: "The <adjective> <noun>" or "The <noun> of <city stem>"; bands: "The <adjective> <plural>"
# or "<city stem> <plural>". Adjectives are shared by films and bands on purpose.
ADJECTIVES = (
    "Silent", "Crimson", "Hollow", "Broken", "Golden", "Distant", "Burning", "Quiet", "Hidden", "Last",
    "Frozen", "Wild", "Bitter", "Secret", "Endless", "Fallen", "Pale", "Restless", "Scarlet", "Shattered",
    "Sleeping", "Velvet", "Wandering", "Forgotten", "Lonely", "Midnight", "Northern", "Painted", "Savage", "Silver",
    "Stolen", "Sunken", "Twisted", "Whispering", "Wintry", "Amber", "Black", "Blue", "Copper", "Dark",
    "Early", "Final", "Gentle", "Iron", "Lost", "Narrow", "Open", "Long", "Paper", "Glass",
)
FILM_NOUNS = (
    "Harbor", "Orchard", "Mirror", "River", "Garden", "Lantern", "Horizon", "Kingdom", "Letter", "Promise",
    "Season", "Shadow", "Station", "Summer", "Tide", "Valley", "Voyage", "Window", "Witness", "Anchor",
    "Archive", "Border", "Canyon", "Carnival", "Castle", "Circle", "Compass", "Crown", "Desert", "Dream",
    "Echo", "Empire", "Engine", "Feather", "Fire", "Forest", "Frontier", "Game", "Gate", "Heart",
    "Hour", "House", "Island", "Journey", "Key", "Ladder", "Lighthouse", "Machine", "Meadow", "Moon",
    "Mountain", "Night", "Ocean", "Passage", "Road", "Room", "Sky", "Storm", "Street", "Tower",
)
BAND_NOUNS = (
    "Foxes", "Wolves", "Ravens", "Sparrows", "Pilots", "Strangers", "Saints", "Sailors", "Tigers", "Rebels",
    "Giants", "Dreamers", "Drifters", "Hounds", "Owls", "Lions", "Comets", "Rockets", "Bandits", "Monarchs",
    "Hermits", "Jackals", "Kings", "Magpies", "Mariners", "Nomads", "Outlaws", "Pirates", "Poets", "Rivals",
    "Rovers", "Seekers", "Skylarks", "Swans", "Thieves", "Travellers", "Vandals", "Wanderers", "Wizards", "Youths",
)
# How many city stems films and bands may borrow ("The Tide of Belford", "Arden Wolves").
BORROWED_STEMS = 150

FILM_GENRES = (
    "drama", "comedy", "thriller", "western", "musical", "horror", "documentary", "science fiction",
    "romance", "crime",
)
BAND_GENRES = ("rock", "jazz", "folk", "punk", "synth-pop", "indie", "metal", "reggae", "blues", "electronic")
REVIEWS = ("mixed", "positive", "negative", "lukewarm")

# Year ranges (first year, number of years). Their lengths are coprime to 37, the stride that
# spreads the years forced by disambiguators ("(1987 film)") over the range.
BIRTH_YEARS = (1920, 81)
CITY_FOUNDING_YEARS = (1600, 301)
ORG_FOUNDING_YEARS = (1800, 216)
FILM_YEARS = (1930, 93)
BAND_YEARS = (1955, 68)
