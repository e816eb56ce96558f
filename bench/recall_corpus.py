"""The labelled set of `python -m bench.recall`: memories of five owners and the questions
an agent asks about them, each naming the memories that answer it. Kinds: `reworded` (the
answer in other words, few or no shared words), `exact` (words of the answer), `several` (more
than one memory answers) and `none` (nothing the owner has answers it). A question that
names its owner only by a pronoun ("her", "we") or as "the company" is asked over every owner's
memories in the form of `NAMED`, which says whom it means."""

from __future__ import annotations

# (label, owner, owner_type, text)
MEMORIES: list[tuple[str, str, str, str]] = [
    # ---- ana, a user ----
    ("ana-peanuts", "ana", "user", "Ana is allergic to peanuts and carries an epinephrine pen"),
    ("ana-vegetarian", "ana", "user", "Ana has been vegetarian since 2019 and avoids fish too"),
    ("ana-coffee", "ana", "user", "Ana drinks her coffee black with no sugar"),
    ("ana-daughter", "ana", "user", "Ana's daughter Lucia turns seven in March"),
    ("ana-husband", "ana", "user", "Ana is married to Pedro, a high school chemistry teacher"),
    ("ana-job", "ana", "user", "Ana works as a pediatric nurse at Saint Mary hospital"),
    ("ana-shifts", "ana", "user", "Ana works night shifts on Tuesdays and Thursdays"),
    ("ana-running", "ana", "user", "Ana trains for the Lisbon half marathon every weekend"),
    ("ana-knee", "ana", "user", "Ana hurt her left knee last autumn and avoids downhill runs"),
    ("ana-spanish", "ana", "user", "Ana's first language is Spanish; she prefers emails in it"),
    ("ana-car", "ana", "user", "Ana drives a blue 2016 Toyota Corolla"),
    ("ana-flat", "ana", "user", "Ana rents a two bedroom flat near the river in Porto"),
    ("ana-cat", "ana", "user", "Ana has a grey cat named Nube who hates the vacuum cleaner"),
    ("ana-birthday", "ana", "user", "Ana was born on the 14th of June 1988"),
    ("ana-books", "ana", "user", "Ana reads detective novels, Agatha Christie above all"),
    ("ana-bank", "ana", "user", "Ana banks with Millennium and pays rent on the first"),
    ("ana-doctor", "ana", "user", "Ana's family doctor is Dr. Sousa at the Boavista clinic"),
    ("ana-piano", "ana", "user", "Ana took piano lessons as a child and still plays Chopin"),
    ("ana-sleep", "ana", "user", "Ana sleeps badly when the room is warmer than 20 degrees"),
    ("ana-holiday", "ana", "user", "Ana plans a trip to Japan in October with Pedro"),
    ("ana-lactose", "ana", "user", "Ana is lactose intolerant, so no milk in her food"),
    ("ana-phone", "ana", "user", "Ana prefers text messages to phone calls during the day"),
    # ---- bob, a user ----
    ("bob-seat", "bob", "user", "Bob always books a window seat on flights"),
    ("bob-airline", "bob", "user", "Bob collects miles with Lufthansa and flies business on "
     "long routes"),
    ("bob-hotel", "bob", "user", "Bob wants hotel rooms on a high floor, far from the elevator"),
    ("bob-gluten", "bob", "user", "Bob has coeliac disease and must not eat wheat or barley"),
    ("bob-wine", "bob", "user", "Bob enjoys red wine from the Douro valley"),
    ("bob-job", "bob", "user", "Bob is a sales director covering Germany and Austria"),
    ("bob-boss", "bob", "user", "Bob reports to Helga Schmidt, the vice president of sales"),
    ("bob-meetings", "bob", "user", "Bob refuses meetings before 9 in the morning"),
    ("bob-son", "bob", "user", "Bob's son Max studies mechanical engineering in Munich"),
    ("bob-golf", "bob", "user", "Bob plays golf on Saturday mornings with a handicap of 12"),
    ("bob-car", "bob", "user", "Bob leases a black BMW 5 series electric"),
    ("bob-home", "bob", "user", "Bob lives in Frankfurt with his wife Karin"),
    ("bob-anniversary", "bob", "user", "Bob and Karin married on the 2nd of May 1995"),
    ("bob-blood", "bob", "user", "Bob takes blood pressure pills every morning"),
    ("bob-languages", "bob", "user", "Bob speaks German, English and a little Italian"),
    ("bob-laptop", "bob", "user", "Bob's laptop is a ThinkPad X1 that IT replaced in August"),
    ("bob-expenses", "bob", "user", "Bob submits expense reports on the last Friday of the "
     "month"),
    ("bob-gift", "bob", "user", "Bob gave his assistant a Montblanc pen for her birthday"),
    ("bob-coffee", "bob", "user", "Bob drinks espresso with oat milk"),
    ("bob-football", "bob", "user", "Bob supports Eintracht Frankfurt and has a season ticket"),
    ("bob-dentist", "bob", "user", "Bob has a dentist appointment on the 3rd of December"),
    # ---- carla, a user ----
    ("carla-cello", "carla", "user", "Carla's daughter plays the cello in the youth orchestra"),
    ("carla-garden", "carla", "user", "Carla grows tomatoes and basil on her balcony"),
    ("carla-dog", "carla", "user", "Carla walks her beagle Toby twice a day"),
    ("carla-job", "carla", "user", "Carla is a freelance translator from Italian to English"),
    ("carla-rate", "carla", "user", "Carla charges twelve cents per word for translations"),
    ("carla-deadline", "carla", "user", "Carla must deliver the contract translation by Friday"),
    ("carla-migraine", "carla", "user", "Carla gets migraines from bright screens and uses dark "
     "mode"),
    ("carla-yoga", "carla", "user", "Carla goes to yoga on Monday and Wednesday evenings"),
    ("carla-tea", "carla", "user", "Carla drinks green tea in the afternoon, never coffee"),
    ("carla-flat", "carla", "user", "Carla lives in a flat in Bologna with a small balcony"),
    ("carla-bike", "carla", "user", "Carla cycles everywhere and owns no car"),
    ("carla-mother", "carla", "user", "Carla's mother lives in Naples and calls every Sunday"),
    ("carla-vegan", "carla", "user", "Carla eats a vegan diet"),
    ("carla-film", "carla", "user", "Carla loves old Fellini films"),
    ("carla-tax", "carla", "user", "Carla files her taxes with an accountant named Rossi"),
    ("carla-insurance", "carla", "user", "Carla's health insurance renews every January"),
    ("carla-software", "carla", "user", "Carla translates with Trados and keeps glossaries per "
     "client"),
    ("carla-client", "carla", "user", "Carla's biggest client is a law firm in London"),
    ("carla-birthday", "carla", "user", "Carla's birthday is on the 30th of September"),
    ("carla-swim", "carla", "user", "Carla cannot swim and is afraid of deep water"),
    # ---- ops-bot, an agent ----
    ("ops-deploy", "ops-bot", "agent", "Production deploys run every Friday at noon UTC"),
    ("ops-freeze", "ops-bot", "agent", "No deploys during the December change freeze"),
    ("ops-db", "ops-bot", "agent", "The main database is PostgreSQL 16 on three nodes"),
    ("ops-backup", "ops-bot", "agent", "Database backups are taken nightly at 02:00 and kept "
     "for 30 days"),
    ("ops-oncall", "ops-bot", "agent", "The on-call rotation changes every Monday at 09:00"),
    ("ops-pager", "ops-bot", "agent", "Pages go to PagerDuty; escalate after 15 minutes"),
    ("ops-region", "ops-bot", "agent", "The service runs in the eu-west-1 region with a "
     "standby in eu-central-1"),
    ("ops-k8s", "ops-bot", "agent", "Workloads run on Kubernetes 1.30 with autoscaling on CPU"),
    ("ops-cdn", "ops-bot", "agent", "Static assets are served through Cloudflare"),
    ("ops-tls", "ops-bot", "agent", "TLS certificates renew automatically 30 days before "
     "expiry"),
    ("ops-secrets", "ops-bot", "agent", "Secrets live in Vault and rotate every 90 days"),
    ("ops-logs", "ops-bot", "agent", "Logs are shipped to Loki and kept for 14 days"),
    ("ops-metrics", "ops-bot", "agent", "Prometheus scrapes every service every 15 seconds"),
    ("ops-sla", "ops-bot", "agent", "The uptime commitment to customers is 99.9 percent a "
     "month"),
    ("ops-incident", "ops-bot", "agent", "The last major incident was a disk full on the "
     "primary database in July"),
    ("ops-ci", "ops-bot", "agent", "CI runs on GitHub Actions and blocks merges on failures"),
    ("ops-costs", "ops-bot", "agent", "Cloud spend is about 40,000 euros a month, mostly "
     "compute"),
    ("ops-dns", "ops-bot", "agent", "DNS is managed in Route 53 with a 300 second TTL"),
    ("ops-redis", "ops-bot", "agent", "Sessions are cached in Redis with a one hour expiry"),
    ("ops-queue", "ops-bot", "agent", "Background jobs go through RabbitMQ"),
    ("ops-access", "ops-bot", "agent", "Production shell access needs a ticket and expires "
     "after 8 hours"),
    ("ops-version", "ops-bot", "agent", "The API gateway is nginx 1.25"),
    # ---- acme, an organization ----
    ("acme-holidays", "acme", "organization", "Employees get 25 days of paid leave a year"),
    ("acme-remote", "acme", "organization", "Staff may work from home three days a week"),
    ("acme-expenses", "acme", "organization", "Meals on business trips are reimbursed up to "
     "50 euros a day"),
    ("acme-travel", "acme", "organization", "Flights under four hours must be booked in "
     "economy"),
    ("acme-laptops", "acme", "organization", "Laptops are replaced every three years"),
    ("acme-security", "acme", "organization", "Passwords must be at least 14 characters and "
     "use a manager"),
    ("acme-training", "acme", "organization", "Each employee has a training budget of 1,500 "
     "euros a year"),
    ("acme-hours", "acme", "organization", "Core hours are 10:00 to 16:00"),
    ("acme-parental", "acme", "organization", "Parental leave is 20 weeks at full pay"),
    ("acme-pension", "acme", "organization", "The company adds 5 percent of salary to the "
     "pension plan"),
    ("acme-office", "acme", "organization", "The head office is at 12 Harbour Street, "
     "Rotterdam"),
    ("acme-canteen", "acme", "organization", "The canteen serves lunch from 12:00 to 14:00"),
    ("acme-parking", "acme", "organization", "Parking spaces go to staff with electric cars "
     "first"),
    ("acme-review", "acme", "organization", "Performance reviews happen twice a year, in "
     "April and October"),
    ("acme-sick", "acme", "organization", "Report sick leave to your manager before 09:00"),
    ("acme-gifts", "acme", "organization", "Gifts from suppliers above 50 euros must be "
     "declared"),
    ("acme-ceo", "acme", "organization", "The chief executive is Marleen de Vries since 2021"),
    ("acme-bonus", "acme", "organization", "Bonuses are paid in March based on the yearly "
     "results"),
    ("acme-probation", "acme", "organization", "New hires have a two month probation period"),
    ("acme-dress", "acme", "organization", "There is no dress code except for client "
     "visits"),
]

# (kind, owner, question, labels of the memories that answer it)
QUESTIONS: list[tuple[str, str, str, list[str]]] = [
    # ---- reworded ----
    ("reworded", "ana", "what food could hurt Ana?", ["ana-peanuts", "ana-lactose"]),
    ("reworded", "ana", "does she eat meat?", ["ana-vegetarian"]),
    ("reworded", "ana", "how old is her child?", ["ana-daughter"]),
    ("reworded", "ana", "who is her spouse?", ["ana-husband"]),
    ("reworded", "ana", "what is her profession?", ["ana-job"]),
    ("reworded", "ana", "which evenings is she at the hospital overnight?", ["ana-shifts"]),
    ("reworded", "ana", "what race is she preparing for?", ["ana-running"]),
    ("reworded", "ana", "which vehicle does she own?", ["ana-car"]),
    ("reworded", "ana", "does she have any pets?", ["ana-cat"]),
    ("reworded", "ana", "what instrument can she play?", ["ana-piano"]),
    ("reworded", "ana", "where is she travelling this autumn?", ["ana-holiday"]),
    ("reworded", "bob", "where does Bob like to sit on a plane?", ["bob-seat"]),
    ("reworded", "bob", "which grains can he not eat?", ["bob-gluten"]),
    ("reworded", "bob", "who is his manager?", ["bob-boss"]),
    ("reworded", "bob", "what sport does he play at the weekend?", ["bob-golf"]),
    ("reworded", "bob", "which medication does he take?", ["bob-blood"]),
    ("reworded", "bob", "which team does he cheer for?", ["bob-football"]),
    ("reworded", "bob", "when is their wedding anniversary?", ["bob-anniversary"]),
    ("reworded", "carla", "what instrument does the child practice?", ["carla-cello"]),
    ("reworded", "carla", "what vegetables does she grow?", ["carla-garden"]),
    ("reworded", "carla", "what kind of dog does she have?", ["carla-dog"]),
    ("reworded", "carla", "how much does she ask for her work?", ["carla-rate"]),
    ("reworded", "carla", "what gives her headaches?", ["carla-migraine"]),
    ("reworded", "carla", "how does she get around town?", ["carla-bike"]),
    ("reworded", "ops-bot", "when do releases go out?", ["ops-deploy"]),
    ("reworded", "ops-bot", "how long are database dumps retained?", ["ops-backup"]),
    ("reworded", "ops-bot", "where are passwords and keys stored?", ["ops-secrets"]),
    ("reworded", "ops-bot", "which cloud region hosts us?", ["ops-region"]),
    ("reworded", "ops-bot", "how much do we spend on infrastructure?", ["ops-costs"]),
    ("reworded", "acme", "how much vacation do employees get?", ["acme-holidays"]),
    ("reworded", "acme", "can I work remotely?", ["acme-remote"]),
    ("reworded", "acme", "how often do I get a new computer?", ["acme-laptops"]),
    ("reworded", "acme", "who runs the company?", ["acme-ceo"]),
    ("reworded", "acme", "how long is maternity leave?", ["acme-parental"]),
    # ---- exact ----
    ("exact", "ana", "epinephrine pen", ["ana-peanuts"]),
    ("exact", "ana", "Agatha Christie", ["ana-books"]),
    ("exact", "ana", "Dr. Sousa at the Boavista clinic", ["ana-doctor"]),
    ("exact", "bob", "Lufthansa miles", ["bob-airline"]),
    ("exact", "bob", "ThinkPad X1", ["bob-laptop"]),
    ("exact", "bob", "Montblanc pen", ["bob-gift"]),
    ("exact", "carla", "Trados glossaries", ["carla-software"]),
    ("exact", "carla", "Fellini films", ["carla-film"]),
    ("exact", "ops-bot", "PagerDuty escalation", ["ops-pager"]),
    ("exact", "ops-bot", "Route 53 TTL", ["ops-dns"]),
    ("exact", "ops-bot", "RabbitMQ", ["ops-queue"]),
    ("exact", "acme", "12 Harbour Street", ["acme-office"]),
    ("exact", "acme", "probation period", ["acme-probation"]),
    ("exact", "ana", "Nube", ["ana-cat"]),
    ("exact", "bob", "Helga Schmidt", ["bob-boss"]),
    ("exact", "carla", "Rossi", ["carla-tax"]),
    ("exact", "ops-bot", "eu-central-1", ["ops-region"]),
    ("exact", "ops-bot", "Loki", ["ops-logs"]),
    ("exact", "acme", "Marleen de Vries", ["acme-ceo"]),
    # ---- several answers ----
    ("several", "ana", "what should we avoid when cooking for Ana?",
     ["ana-peanuts", "ana-vegetarian", "ana-lactose"]),
    ("several", "ana", "who are the members of her family?", ["ana-daughter", "ana-husband"]),
    ("several", "bob", "what does Bob want when he travels?",
     ["bob-seat", "bob-airline", "bob-hotel"]),
    ("several", "bob", "what does he drink?", ["bob-wine", "bob-coffee"]),
    ("several", "carla", "what does she eat and drink?", ["carla-vegan", "carla-tea"]),
    ("several", "carla", "what is her weekly exercise?", ["carla-yoga", "carla-dog",
                                                          "carla-bike"]),
    ("several", "ops-bot", "how do we monitor and observe the system?",
     ["ops-logs", "ops-metrics", "ops-pager"]),
    ("several", "ops-bot", "when are we not allowed to ship changes?",
     ["ops-freeze", "ops-deploy"]),
    ("several", "acme", "what are the rules for business travel costs?",
     ["acme-expenses", "acme-travel"]),
    ("several", "acme", "what benefits do employees get?",
     ["acme-holidays", "acme-pension", "acme-training", "acme-parental"]),
    # ---- no answer ----
    ("none", "ana", "what is her favourite football club?", []),
    ("none", "ana", "which programming language does she use?", []),
    ("none", "bob", "does Bob have a cat?", []),
    ("none", "bob", "what is his shoe size?", []),
    ("none", "carla", "what car does she drive?", []),
    ("none", "carla", "which bank holds her mortgage?", []),
    ("none", "ops-bot", "what is the office wifi password?", []),
    ("none", "ops-bot", "who won the chess tournament?", []),
    ("none", "acme", "what is the company stock price?", []),
    ("none", "acme", "quantum chromodynamics lecture notes", []),
]

# The form a question takes when asked without an owner filter, over every owner's memories,
# for each question that names its owner only by a pronoun or as "the child" / "the company":
# the owner named, the question otherwise unchanged (with an owner filter the question is asked
# as above, as an agent recalling about its user would).
NAMED: dict[str, str] = {
    "does she eat meat?": "does Ana eat meat?",
    "how old is her child?": "how old is Ana's child?",
    "who is her spouse?": "who is Ana's spouse?",
    "what is her profession?": "what is Ana's profession?",
    "which evenings is she at the hospital overnight?":
        "which evenings is Ana at the hospital overnight?",
    "what race is she preparing for?": "what race is Ana preparing for?",
    "which vehicle does she own?": "which vehicle does Ana own?",
    "does she have any pets?": "does Ana have any pets?",
    "what instrument can she play?": "what instrument can Ana play?",
    "where is she travelling this autumn?": "where is Ana travelling this autumn?",
    "who are the members of her family?": "who are the members of Ana's family?",
    "what is her favourite football club?": "what is Ana's favourite football club?",
    "which programming language does she use?": "which programming language does Ana use?",
    "which grains can he not eat?": "which grains can Bob not eat?",
    "who is his manager?": "who is Bob's manager?",
    "what sport does he play at the weekend?": "what sport does Bob play at the weekend?",
    "which medication does he take?": "which medication does Bob take?",
    "which team does he cheer for?": "which team does Bob cheer for?",
    "when is their wedding anniversary?": "when is Bob's wedding anniversary?",
    "what does he drink?": "what does Bob drink?",
    "what is his shoe size?": "what is Bob's shoe size?",
    "what instrument does the child practice?": "what instrument does Carla's child practice?",
    "what vegetables does she grow?": "what vegetables does Carla grow?",
    "what kind of dog does she have?": "what kind of dog does Carla have?",
    "how much does she ask for her work?": "how much does Carla ask for her work?",
    "what gives her headaches?": "what gives Carla headaches?",
    "how does she get around town?": "how does Carla get around town?",
    "what does she eat and drink?": "what does Carla eat and drink?",
    "what is her weekly exercise?": "what is Carla's weekly exercise?",
    "what car does she drive?": "what car does Carla drive?",
    "which bank holds her mortgage?": "which bank holds Carla's mortgage?",
    "which cloud region hosts us?": "which cloud region hosts ops-bot?",
    "how much do we spend on infrastructure?": "how much does ops-bot spend on infrastructure?",
    "how do we monitor and observe the system?": "how does ops-bot monitor and observe the "
                                                 "system?",
    "when are we not allowed to ship changes?": "when is ops-bot not allowed to ship changes?",
    "can I work remotely?": "can I work remotely at Acme?",
    "how often do I get a new computer?": "how often do I get a new computer at Acme?",
    "who runs the company?": "who runs Acme?",
    "what is the company stock price?": "what is Acme's stock price?",
}
_UNKNOWN = NAMED.keys() - {question for _, _, question, _ in QUESTIONS}
if _UNKNOWN:
    raise ValueError(f"NAMED holds questions the corpus does not ask: {sorted(_UNKNOWN)}")


def asked(question: str, owner_filter: bool) -> str:
    """The question as asked with an owner filter, or over every owner's memories."""
    return question if owner_filter else NAMED.get(question, question)
