"""Repository templates (part B); see templates_a for the conventions."""

from legorl_jax.taskgen.synthetic.template import Module, Template

DATES = Template(
    name="dates", package="datehelpers",
    title="Date helpers", summary="Leap years, month lengths and day arithmetic without the datetime module.",
    modules=(
        Module("calendar_math", "Calendar rules.", '''
def is_leap_year(year):
    """Gregorian leap year rule."""
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0


def days_in_month(year, month):
    """Number of days in ``month`` (1-12) of ``year``."""
    if month < 1 or month > 12:
        raise ValueError("month must be in 1..12")
    if month == 2:
        return 29 if is_leap_year(year) else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31


def day_of_year(year, month, day):
    """1-based ordinal of the date within its year."""
    total = day
    for m in range(1, month):
        total += days_in_month(year, m)
    return total
''', {
            "is_leap_year": ["is_leap_year(2024)", "is_leap_year(1900)", "is_leap_year(2000)", "is_leap_year(2023)"],
            "days_in_month": ["days_in_month(2023, 2)", "days_in_month(2024, 2)", "days_in_month(2023, 4)",
                              "days_in_month(2023, 12)"],
            "day_of_year": ["day_of_year(2023, 1, 1)", "day_of_year(2023, 3, 1)", "day_of_year(2024, 12, 31)"],
        }),
        Module("durations", "Formatting and adding durations.", '''
def format_duration(seconds):
    """'H:MM:SS' for a non-negative number of seconds."""
    hours = seconds // 3600
    minutes = (seconds % 3600) // 60
    secs = seconds % 60
    return f"{hours}:{minutes:02d}:{secs:02d}"


def add_minutes(hour, minute, delta):
    """(hour, minute) on a 24-hour clock after adding ``delta`` minutes."""
    total = (hour * 60 + minute + delta) % (24 * 60)
    return (total // 60, total % 60)


def overlap_minutes(start_a, end_a, start_b, end_b):
    """Minutes shared by the intervals [start_a, end_a) and [start_b, end_b)."""
    start = max(start_a, start_b)
    end = min(end_a, end_b)
    return max(0, end - start)
''', {
            "format_duration": ["format_duration(3725)", "format_duration(59)", "format_duration(7200)"],
            "add_minutes": ["add_minutes(10, 30, 45)", "add_minutes(23, 50, 20)", "add_minutes(0, 0, 0)"],
            "overlap_minutes": ["overlap_minutes(0, 60, 30, 90)", "overlap_minutes(0, 10, 20, 30)",
                                "overlap_minutes(5, 50, 10, 20)"],
        }),
    ))

BANK = Template(
    name="bank", package="minibank",
    title="Mini bank", summary="Balances, interest and transfer rules for simple savings accounts.",
    modules=(
        Module("accounts", "Deposits, withdrawals and transfers on balance dictionaries.", '''
def deposit(balance, amount):
    """New balance after depositing a positive ``amount``."""
    if amount <= 0:
        raise ValueError("deposit must be positive")
    return balance + amount


def withdraw(balance, amount, overdraft=0):
    """New balance after withdrawing ``amount``; the balance may go down to -overdraft."""
    if amount > balance + overdraft:
        raise ValueError("insufficient funds")
    return balance - amount


def transfer(balances, source, target, amount):
    """Copy of ``balances`` after moving ``amount`` from ``source`` to ``target``."""
    if balances[source] < amount:
        raise ValueError("insufficient funds")
    updated = dict(balances)
    updated[source] -= amount
    updated[target] = updated.get(target, 0) + amount
    return updated
''', {
            "deposit": ["deposit(100, 50)", "deposit(0, 1)", "deposit(10, 2.5)"],
            "withdraw": ["withdraw(100, 30)", "withdraw(50, 60, overdraft=20)", "withdraw(40, 40)"],
            "transfer": ["transfer({'a': 100, 'b': 5}, 'a', 'b', 30)", "transfer({'a': 10}, 'a', 'c', 10)",
                         "transfer({'a': 7, 'b': 1}, 'b', 'a', 1)"],
        }),
        Module("interest", "Interest and fees.", '''
def compound(principal, rate, years):
    """Balance after ``years`` of yearly compounding at ``rate`` (0.05 = 5%), to cents."""
    balance = principal
    for _ in range(years):
        balance = balance * (1 + rate)
    return round(balance, 2)


def monthly_fee(balance, minimum=1000, fee=5):
    """Fee charged for the month: ``fee`` when the balance is below ``minimum``, else 0."""
    if balance < minimum:
        return fee
    return 0


def interest_earned(principal, rate, years):
    """Interest earned over ``years`` of yearly compounding, to cents."""
    return round(compound(principal, rate, years) - principal, 2)
''', {
            "compound": ["compound(1000, 0.1, 2)", "compound(500, 0.0, 3)", "compound(100, 0.5, 1)"],
            "monthly_fee": ["monthly_fee(999)", "monthly_fee(1000)", "monthly_fee(20, minimum=10, fee=2)"],
            "interest_earned": ["interest_earned(1000, 0.1, 2)", "interest_earned(200, 0.05, 0)",
                                "interest_earned(100, 0.5, 1)"],
        }),
    ))

GRADES = Template(
    name="grades", package="gradebook",
    title="Gradebook", summary="Averages, letter grades and rankings for course scores.",
    modules=(
        Module("scores", "Averages and letter grades.", '''
def average(scores):
    """Mean of a list of scores; 0.0 for an empty list."""
    if not scores:
        return 0.0
    return sum(scores) / len(scores)


def letter(score):
    """Letter grade: A from 90, B from 80, C from 70, D from 60, else F."""
    if score >= 90:
        return "A"
    if score >= 80:
        return "B"
    if score >= 70:
        return "C"
    if score >= 60:
        return "D"
    return "F"


def drop_lowest(scores, k):
    """The scores without the ``k`` lowest ones (order kept)."""
    if k <= 0:
        return list(scores)
    cut = sorted(scores)[k - 1]
    dropped, out = 0, []
    for s in scores:
        if s <= cut and dropped < k:
            dropped += 1
            continue
        out.append(s)
    return out
''', {
            "average": ["average([80, 90, 100])", "average([])", "average([75])"],
            "letter": ["letter(95)", "letter(90)", "letter(80)", "letter(79.5)", "letter(60)", "letter(12)"],
            "drop_lowest": ["drop_lowest([70, 50, 90, 60], 2)", "drop_lowest([1, 2, 3], 0)",
                            "drop_lowest([5, 3, 5], 1)"],
        }),
        Module("ranking", "Ranking students.", '''
def rank(totals):
    """Student names ordered by total score, highest first, ties by name."""
    return sorted(totals, key=lambda name: (-totals[name], name))


def passed(totals, cutoff):
    """Names of students whose total is at least ``cutoff``, sorted."""
    return sorted(name for name, total in totals.items() if total >= cutoff)


def percentile(totals, name):
    """Percentage of the other students that ``name`` scored strictly above."""
    others = [t for n, t in totals.items() if n != name]
    if not others:
        return 100.0
    below = sum(1 for t in others if t < totals[name])
    return 100.0 * below / len(others)
''', {
            "rank": ["rank({'ann': 80, 'bob': 95, 'cid': 80})", "rank({'x': 1})", "rank({'a': 2, 'b': 3})"],
            "passed": ["passed({'ann': 60, 'bob': 59, 'cid': 90}, 60)", "passed({'a': 1}, 5)",
                       "passed({'b': 5, 'a': 5}, 5)"],
            "percentile": ["percentile({'a': 10, 'b': 20, 'c': 30}, 'c')", "percentile({'a': 10}, 'a')",
                           "percentile({'a': 10, 'b': 10, 'c': 5}, 'a')"],
        }),
    ))

PRICING = Template(
    name="pricing", package="pricing",
    title="Pricing", summary="Discounts, taxes and shopping-cart totals.",
    modules=(
        Module("discounts", "Discount rules.", '''
def apply_discount(price, percent):
    """Price after a ``percent`` discount (0-100), to cents."""
    if percent < 0 or percent > 100:
        raise ValueError("percent must be in 0..100")
    return round(price * (100 - percent) / 100, 2)


def bulk_discount(quantity):
    """Discount percent for a quantity: 10 from 10 units, 20 from 50 units, else 0."""
    if quantity >= 50:
        return 20
    if quantity >= 10:
        return 10
    return 0


def best_coupon(price, coupons):
    """Lowest price reachable with one coupon; coupons are percents or fixed amounts
    given as ('percent', p) or ('fixed', amount). Never below 0."""
    best = price
    for kind, value in coupons:
        if kind == "percent":
            candidate = apply_discount(price, value)
        else:
            candidate = max(0, price - value)
        best = min(best, candidate)
    return best
''', {
            "apply_discount": ["apply_discount(80, 25)", "apply_discount(19.99, 0)", "apply_discount(10, 100)"],
            "bulk_discount": ["bulk_discount(9)", "bulk_discount(10)", "bulk_discount(50)", "bulk_discount(75)"],
            "best_coupon": ["best_coupon(100, [('percent', 10), ('fixed', 15)])",
                            "best_coupon(20, [('fixed', 30)])", "best_coupon(50, [])"],
        }),
        Module("cart", "Cart totals with tax.", '''
def subtotal(items):
    """Sum of quantity * unit price over (name, quantity, unit_price) items."""
    return round(sum(qty * price for _, qty, price in items), 2)


def with_tax(amount, rate=0.2):
    """Amount including tax at ``rate``, to cents."""
    return round(amount * (1 + rate), 2)


def item_count(items):
    """Total number of units in the cart."""
    count = 0
    for _, qty, _ in items:
        count += qty
    return count
''', {
            "subtotal": ["subtotal([('pen', 2, 1.5), ('book', 1, 12.0)])", "subtotal([])",
                         "subtotal([('cup', 3, 2.25)])"],
            "with_tax": ["with_tax(100)", "with_tax(50, rate=0.1)", "with_tax(0)"],
            "item_count": ["item_count([('pen', 2, 1.5), ('book', 1, 12.0)])", "item_count([])",
                           "item_count([('cup', 3, 2.25), ('lid', 4, 0.1)])"],
        }),
    ))

TEMPLATES_B = (DATES, BANK, GRADES, PRICING)
