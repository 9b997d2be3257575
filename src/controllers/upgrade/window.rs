//! Recurring maintenance windows: when a `RolloutPolicy` lets a node start its move.
//!
//! A [`MaintenanceWindow`] opens at `start`, the local time of day in `timeZone` (`UTC`
//! when empty), on each of its `days` (every day when empty), and stays open for
//! `durationSeconds` of real time: a window may cross midnight and even span days, and on
//! a day when the clocks change it still lasts its duration in seconds, not on the wall
//! clock. A start that falls in a daylight-saving gap (02:30 on the night clocks jump
//! from 02:00 to 03:00) opens after the gap (03:30); one that falls in a fold (clocks
//! going back) opens at the first of the two repeated times. This is jiff's compatible
//! disambiguation, as [`TimeZone::to_timestamp`] does it.
//!
//! A window's opening is half-open: open from the opening instant included to the close
//! excluded. Several windows, or openings of one window, that overlap or touch make one
//! stretch of open time: [`WindowState::Open`] closes when the last of them does.
//!
//! Everything here is pure arithmetic on [`Timestamp`]s: the controllers pass `now`, and
//! `capstan plan` passes the moment it asks about. Time zones come from jiff's bundled
//! database (the `tzdb-bundle-always` feature), so a machine without
//! `/usr/share/zoneinfo` resolves them alike.
//!
//! The openings are found by scanning candidate days around the moment asked about, in
//! each window's own time zone: back far enough for an opening still open
//! (`ceil(duration / 1 day) + 1` days, at most 9: a window that lasts longer than 8
//! days and opens at least weekly has a more recent opening still open), and 8 days
//! ahead, which holds the next opening of any window (it opens at least once a week).

use capstan_api::MaintenanceWindow;
use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Span, Timestamp};

/// Seconds in a day of 24 hours, to count how many days back a long window may have
/// opened.
const DAY_SECONDS: u64 = 86_400;

/// Days scanned ahead of the moment asked about: a week and one day, so that the next
/// opening of a window that opens once a week is always among them.
const DAYS_AHEAD: i64 = 8;

/// Most days scanned back: an opening further back than this is never the latest one
/// still open (see the module documentation).
const MOST_DAYS_BACK: u64 = 9;

/// The days a window may name, in week order: the weekday, its short name (the one
/// `describe` writes) and its full English name (also accepted).
const DAYS: [(Weekday, &str, &str); 7] = [
    (Weekday::Monday, "mon", "monday"),
    (Weekday::Tuesday, "tue", "tuesday"),
    (Weekday::Wednesday, "wed", "wednesday"),
    (Weekday::Thursday, "thu", "thursday"),
    (Weekday::Friday, "fri", "friday"),
    (Weekday::Saturday, "sat", "saturday"),
    (Weekday::Sunday, "sun", "sunday"),
];

/// Whether nodes may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// No window is configured: always open.
    Always,
    /// Inside a window; it closes at `closes_at` (the latest close among overlapping open
    /// windows: the end of the stretch of open time that holds now, followed through the
    /// openings of the next 8 days; a policy whose windows never leave a gap is found open
    /// again then).
    Open {
        /// When nodes may no longer start, unless another window has opened by then.
        closes_at: Timestamp,
    },
    /// Outside every window; the next one opens at `opens_at` (`Timestamp::MAX` when no
    /// window is valid: a policy whose windows are all broken never lets a node start,
    /// rather than letting them all start at once).
    Closed {
        /// When nodes may start next.
        opens_at: Timestamp,
    },
}

/// The state at `now` of `windows` (assumed valid per `check`; an invalid window is
/// ignored).
///
/// The controllers ask this before letting a node start its move, and requeue at
/// `closes_at` or `opens_at`.
pub fn state(windows: &[MaintenanceWindow], now: Timestamp) -> WindowState {
    if windows.is_empty() {
        return WindowState::Always;
    }
    let mut openings: Vec<(Timestamp, Timestamp)> = windows
        .iter()
        .filter_map(|window| Window::parse(window).ok())
        .flat_map(|window| window.openings_around(now))
        .collect();
    openings.sort();
    // Follow the stretch of open time from now: sorted by opening, each opening that
    // starts before the stretch ends (touching counts) carries it on.
    let mut closes_at = now;
    for &(opens, closes) in &openings {
        if opens > closes_at {
            break;
        }
        closes_at = closes_at.max(closes);
    }
    if closes_at > now {
        return WindowState::Open { closes_at };
    }
    let opens_at = openings
        .iter()
        .map(|&(opens, _)| opens)
        .filter(|&opens| opens > now)
        .min()
        .unwrap_or(Timestamp::MAX);
    WindowState::Closed { opens_at }
}

/// The first moment at or after `at` when some window is open, and when that window
/// closes (None for no windows): used by `capstan plan` to say when a node will start.
///
/// The close is the one [`state`] reports at that moment. `None` also when no window is
/// valid: no node would ever start.
pub fn next_open(windows: &[MaintenanceWindow], at: Timestamp) -> Option<(Timestamp, Timestamp)> {
    match state(windows, at) {
        WindowState::Always => None,
        WindowState::Open { closes_at } => Some((at, closes_at)),
        WindowState::Closed { opens_at } if opens_at == Timestamp::MAX => None,
        WindowState::Closed { opens_at } => match state(windows, opens_at) {
            WindowState::Open { closes_at } => Some((opens_at, closes_at)),
            // An opening always holds its own first instant.
            WindowState::Always | WindowState::Closed { .. } => None,
        },
    }
}

/// Why a window is invalid, naming the field (`days`, `start`, `duration`, `timeZone`)
/// and what would do: e.g. `start: "25:00" is not a time of day: write HH:MM, such as
/// 02:00`; `timeZone: "Mars/Base" is not a known time zone: write an IANA name, such as
/// Europe/Paris`; `days: "funday" is not a day: write mon, tue, wed, thu, fri, sat or
/// sun`; `duration: must be at least 1 second`.
///
/// Validation refuses a commit with such a window, so that [`state`] never meets one;
/// the first problem, in the order of the fields, is reported.
pub fn check(window: &MaintenanceWindow) -> Result<(), String> {
    Window::parse(window).map(|_| ())
}

/// A human description of a window for plans and Events, e.g. "sat, sun 02:00 for 4h
/// Europe/Paris".
///
/// Days are written short and in week order ("every day" when none is listed), the start
/// as HH:MM, the duration in hours, minutes and seconds, and the time zone by its name
/// (`UTC` when empty). A field that does not parse is written as it is, so that an Event
/// about a broken window still shows what was written.
pub fn describe(window: &MaintenanceWindow) -> String {
    let days = if window.days.is_empty() {
        "every day".to_owned()
    } else {
        // Known days in week order, then the others as written.
        let mut days: Vec<(usize, String)> = window
            .days
            .iter()
            .map(|day| match day_index(day) {
                Some(index) => (index, DAYS[index].1.to_owned()),
                None => (DAYS.len(), day.clone()),
            })
            .collect();
        days.sort();
        days.dedup();
        days.into_iter()
            .map(|(_, day)| day)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let start = match parse_start(&window.start) {
        Some(start) => start.strftime("%H:%M").to_string(),
        None => window.start.clone(),
    };
    let time_zone = match time_zone(&window.time_zone) {
        Some(tz) => tz.iana_name().unwrap_or("UTC").to_owned(),
        None => window.time_zone.clone(),
    };
    format!(
        "{days} {start} for {} {time_zone}",
        human_duration(window.duration_seconds)
    )
}

/// A window parsed: what [`state`] computes openings from, and what [`check`] proves
/// can be made.
struct Window {
    /// The weekdays it opens on, indexed as [`DAYS`].
    days: [bool; 7],
    /// The local time it opens at.
    start: Time,
    /// How long it stays open, saturated at what a [`SignedDuration`] holds.
    duration: SignedDuration,
    /// How many local days back an opening may still be open.
    days_back: i64,
    /// Where `start` and the days are read.
    tz: TimeZone,
}

impl Window {
    /// The window `window` describes, or why it is invalid (see [`check`]).
    fn parse(window: &MaintenanceWindow) -> Result<Window, String> {
        let mut days = [window.days.is_empty(); 7];
        for day in &window.days {
            let index = day_index(day).ok_or_else(|| {
                format!("days: {day:?} is not a day: write mon, tue, wed, thu, fri, sat or sun")
            })?;
            days[index] = true;
        }
        let start = parse_start(&window.start).ok_or_else(|| {
            format!(
                "start: {:?} is not a time of day: write HH:MM, such as 02:00",
                window.start
            )
        })?;
        if window.duration_seconds == 0 {
            return Err("duration: must be at least 1 second".to_owned());
        }
        let tz = time_zone(&window.time_zone).ok_or_else(|| {
            format!(
                "timeZone: {:?} is not a known time zone: write an IANA name, such as Europe/Paris",
                window.time_zone
            )
        })?;
        let days_back = (window.duration_seconds.div_ceil(DAY_SECONDS) + 1).min(MOST_DAYS_BACK);
        Ok(Window {
            days,
            start,
            duration: SignedDuration::from_secs(
                i64::try_from(window.duration_seconds).unwrap_or(i64::MAX),
            ),
            days_back: i64::try_from(days_back).unwrap_or(0),
            tz,
        })
    }

    /// The openings, as (opens, closes), of the local days from `days_back` before the
    /// local date of `at` to [`DAYS_AHEAD`] after it. Days beyond the range of
    /// timestamps are left out; a close beyond it is the last timestamp.
    fn openings_around(&self, at: Timestamp) -> Vec<(Timestamp, Timestamp)> {
        let today = self.tz.to_datetime(at).date();
        (-self.days_back..=DAYS_AHEAD)
            .filter_map(|offset| today.checked_add(Span::new().days(offset)).ok())
            .filter(|date| self.days[weekday_index(date.weekday())])
            .filter_map(|date| self.opening_on(date))
            .collect()
    }

    /// The opening on local date `date`, whether or not the window opens on its weekday.
    fn opening_on(&self, date: Date) -> Option<(Timestamp, Timestamp)> {
        let opens = self.tz.to_timestamp(date.to_datetime(self.start)).ok()?;
        let closes = opens.checked_add(self.duration).unwrap_or(Timestamp::MAX);
        Some((opens, closes))
    }
}

/// The index in [`DAYS`] of a day written short or in full, in any case.
fn day_index(day: &str) -> Option<usize> {
    let day = day.trim().to_ascii_lowercase();
    DAYS.iter()
        .position(|&(_, short, long)| day == short || day == long)
}

/// The index in [`DAYS`] of a weekday.
fn weekday_index(weekday: Weekday) -> usize {
    usize::try_from(weekday.to_monday_zero_offset()).unwrap_or(0)
}

/// A time of day written `HH:MM` (24 h; a one-digit hour is accepted).
fn parse_start(start: &str) -> Option<Time> {
    let (hour, minute) = start.trim().split_once(':')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !(1..=2).contains(&hour.len()) || minute.len() != 2 || !digits(hour) || !digits(minute) {
        return None;
    }
    Time::new(hour.parse().ok()?, minute.parse().ok()?, 0, 0).ok()
}

/// The time zone named `name` (an IANA name; `UTC` when empty), from jiff's database.
fn time_zone(name: &str) -> Option<TimeZone> {
    if name.is_empty() {
        return Some(TimeZone::UTC);
    }
    TimeZone::get(name).ok()
}

/// A duration written in hours, minutes and seconds, leaving out the zero ones: `4h`,
/// `1h30m`, `30h`, `45s`.
fn human_duration(seconds: u64) -> String {
    let (hours, minutes, seconds) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    let mut text = String::new();
    for (amount, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
        if amount > 0 {
            text.push_str(&format!("{amount}{unit}"));
        }
    }
    if text.is_empty() {
        text.push_str("0s");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// A window from its days written comma-separated ("" for every day).
    fn window(
        days: &str,
        start: &str,
        duration_seconds: u64,
        time_zone: &str,
    ) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days
                .split(',')
                .filter(|day| !day.is_empty())
                .map(str::to_owned)
                .collect(),
            start: start.into(),
            duration_seconds,
            time_zone: time_zone.into(),
        }
    }

    fn open(closes_at: &str) -> WindowState {
        WindowState::Open {
            closes_at: at(closes_at),
        }
    }

    fn closed(opens_at: &str) -> WindowState {
        WindowState::Closed {
            opens_at: at(opens_at),
        }
    }

    const HOUR: u64 = 3600;

    #[test]
    fn the_state_is_read_from_the_openings_around_now() {
        // 2027-01-02 is a Saturday; Europe/Paris is UTC+1 in winter, UTC+2 in summer
        // (2027-07-03 is a Saturday); clocks go forward on 2027-03-28 (02:00 -> 03:00)
        // and back on 2027-10-31 (03:00 -> 02:00).
        let daily = window("", "02:00", 4 * HOUR, "");
        let weekend = window("sat,sun", "02:00", 4 * HOUR, "UTC");
        // (windows, now, state)
        let rows = [
            // No window: always open.
            (vec![], "2027-01-04T03:00:00Z", WindowState::Always),
            // Inside, before and after a daily window.
            (
                vec![daily.clone()],
                "2027-01-04T03:00:00Z",
                open("2027-01-04T06:00:00Z"),
            ),
            (
                vec![daily.clone()],
                "2027-01-04T01:00:00Z",
                closed("2027-01-04T02:00:00Z"),
            ),
            (
                vec![daily.clone()],
                "2027-01-04T07:00:00Z",
                closed("2027-01-05T02:00:00Z"),
            ),
            // Open from its opening included to its close excluded.
            (
                vec![daily.clone()],
                "2027-01-04T02:00:00Z",
                open("2027-01-04T06:00:00Z"),
            ),
            (
                vec![daily.clone()],
                "2027-01-04T06:00:00Z",
                closed("2027-01-05T02:00:00Z"),
            ),
            // Crossing midnight: opened Saturday, still open Sunday.
            (
                vec![window("sat", "22:00", 4 * HOUR, "UTC")],
                "2027-01-03T01:00:00Z",
                open("2027-01-03T02:00:00Z"),
            ),
            // Spanning days: Saturday 22:00 for 30 h closes Monday 04:00.
            (
                vec![window("sat", "22:00", 30 * HOUR, "UTC")],
                "2027-01-04T03:00:00Z",
                open("2027-01-04T04:00:00Z"),
            ),
            (
                vec![window("sat", "22:00", 30 * HOUR, "UTC")],
                "2027-01-04T04:00:00Z",
                closed("2027-01-09T22:00:00Z"),
            ),
            // Day filter: open on Sunday, closed on Monday and Friday until Saturday.
            (
                vec![weekend.clone()],
                "2027-01-03T03:00:00Z",
                open("2027-01-03T06:00:00Z"),
            ),
            (
                vec![weekend.clone()],
                "2027-01-04T03:00:00Z",
                closed("2027-01-09T02:00:00Z"),
            ),
            (
                vec![weekend.clone()],
                "2027-01-08T03:00:00Z",
                closed("2027-01-09T02:00:00Z"),
            ),
            // Full names, in any case.
            (
                vec![window("Saturday,SUN", "02:00", 4 * HOUR, "")],
                "2027-01-03T03:00:00Z",
                open("2027-01-03T06:00:00Z"),
            ),
            // Europe/Paris in winter: 02:00 local is 01:00 UTC.
            (
                vec![window("", "02:00", 4 * HOUR, "Europe/Paris")],
                "2027-01-04T01:30:00Z",
                open("2027-01-04T05:00:00Z"),
            ),
            (
                vec![window("", "02:00", 4 * HOUR, "Europe/Paris")],
                "2027-01-04T00:30:00Z",
                closed("2027-01-04T01:00:00Z"),
            ),
            // In summer: 02:00 local is 00:00 UTC.
            (
                vec![window("", "02:00", 4 * HOUR, "Europe/Paris")],
                "2027-07-05T00:30:00Z",
                open("2027-07-05T04:00:00Z"),
            ),
            (
                vec![window("", "02:00", 4 * HOUR, "Europe/Paris")],
                "2027-07-04T23:30:00Z",
                closed("2027-07-05T00:00:00Z"),
            ),
            // The days are local: Sunday 23:45 UTC is Monday 00:45 in Paris.
            (
                vec![window("mon", "00:30", HOUR, "Europe/Paris")],
                "2027-01-03T23:45:00Z",
                open("2027-01-04T00:30:00Z"),
            ),
            (
                vec![window("mon", "00:30", HOUR, "UTC")],
                "2027-01-03T23:45:00Z",
                closed("2027-01-04T00:30:00Z"),
            ),
            // Clocks forward: 02:30 does not exist and opens at 03:30 CEST (01:30 UTC).
            (
                vec![window("sun", "02:30", HOUR, "Europe/Paris")],
                "2027-03-28T00:00:00Z",
                closed("2027-03-28T01:30:00Z"),
            ),
            (
                vec![window("sun", "02:30", HOUR, "Europe/Paris")],
                "2027-03-28T02:00:00Z",
                open("2027-03-28T02:30:00Z"),
            ),
            // A window across the change lasts its real duration: 01:00 CET for 4 h
            // closes at 04:00 UTC, 06:00 on the wall clock.
            (
                vec![window("sun", "01:00", 4 * HOUR, "Europe/Paris")],
                "2027-03-28T03:30:00Z",
                open("2027-03-28T04:00:00Z"),
            ),
            // Clocks back: 02:30 happens twice and opens at the first (CEST, 00:30 UTC).
            (
                vec![window("sun", "02:30", HOUR, "Europe/Paris")],
                "2027-10-31T00:00:00Z",
                closed("2027-10-31T00:30:00Z"),
            ),
            (
                vec![window("sun", "02:30", HOUR, "Europe/Paris")],
                "2027-10-31T01:00:00Z",
                open("2027-10-31T01:30:00Z"),
            ),
            // Two overlapping windows: open until the later close, from inside either.
            (
                vec![
                    window("sat", "02:00", 4 * HOUR, "UTC"),
                    window("sat", "05:00", 3 * HOUR, "UTC"),
                ],
                "2027-01-02T05:30:00Z",
                open("2027-01-02T08:00:00Z"),
            ),
            (
                vec![
                    window("sat", "02:00", 4 * HOUR, "UTC"),
                    window("sat", "05:00", 3 * HOUR, "UTC"),
                ],
                "2027-01-02T03:00:00Z",
                open("2027-01-02T08:00:00Z"),
            ),
            // One inside the other: the outer close.
            (
                vec![
                    window("sat", "02:00", 6 * HOUR, "UTC"),
                    window("sat", "03:00", HOUR, "UTC"),
                ],
                "2027-01-02T03:30:00Z",
                open("2027-01-02T08:00:00Z"),
            ),
            // Touching windows make one stretch.
            (
                vec![
                    window("sat", "02:00", HOUR, "UTC"),
                    window("sat", "03:00", HOUR, "UTC"),
                ],
                "2027-01-02T02:30:00Z",
                open("2027-01-02T04:00:00Z"),
            ),
            // A gap between them: the first close.
            (
                vec![
                    window("sat", "02:00", 2 * HOUR, "UTC"),
                    window("sat", "05:00", 3 * HOUR, "UTC"),
                ],
                "2027-01-02T03:00:00Z",
                open("2027-01-02T04:00:00Z"),
            ),
            // Closed: the earliest next opening of any window, in any time zone.
            (
                vec![
                    window("sat", "02:00", HOUR, "UTC"),
                    window("", "23:00", HOUR, "Europe/Paris"),
                ],
                "2027-01-04T12:00:00Z",
                closed("2027-01-04T22:00:00Z"),
            ),
            // An invalid window is ignored; with none valid, nothing ever opens.
            (
                vec![window("funday", "02:00", HOUR, ""), daily.clone()],
                "2027-01-04T03:00:00Z",
                open("2027-01-04T06:00:00Z"),
            ),
            (
                vec![window("", "25:00", HOUR, "")],
                "2027-01-04T03:00:00Z",
                WindowState::Closed {
                    opens_at: Timestamp::MAX,
                },
            ),
        ];
        for (windows, now, expected) in rows {
            assert_eq!(state(&windows, at(now)), expected, "{windows:?} at {now}");
        }
    }

    #[test]
    fn next_open_is_now_inside_a_window_and_the_next_opening_outside() {
        let weekend = window("sat,sun", "02:00", 4 * HOUR, "Europe/Paris");
        // (windows, at, next opening and its close)
        let rows = [
            // No window: never waits, nothing to say.
            (vec![], "2027-01-04T03:00:00Z", None),
            // Inside: from now to the close.
            (
                vec![weekend.clone()],
                "2027-01-03T03:00:00Z",
                Some(("2027-01-03T03:00:00Z", "2027-01-03T05:00:00Z")),
            ),
            // Outside: the next Saturday, 02:00 in Paris.
            (
                vec![weekend.clone()],
                "2027-01-04T03:00:00Z",
                Some(("2027-01-09T01:00:00Z", "2027-01-09T05:00:00Z")),
            ),
            // At a close: the next opening.
            (
                vec![weekend.clone()],
                "2027-01-03T05:00:00Z",
                Some(("2027-01-09T01:00:00Z", "2027-01-09T05:00:00Z")),
            ),
            // A window spanning days: the close is days later.
            (
                vec![window("sat", "22:00", 30 * HOUR, "UTC")],
                "2027-01-04T12:00:00Z",
                Some(("2027-01-09T22:00:00Z", "2027-01-11T04:00:00Z")),
            ),
            // Overlapping windows: the close of the stretch they make.
            (
                vec![
                    window("sat", "02:00", 4 * HOUR, "UTC"),
                    window("sat", "05:00", 3 * HOUR, "UTC"),
                ],
                "2027-01-01T12:00:00Z",
                Some(("2027-01-02T02:00:00Z", "2027-01-02T08:00:00Z")),
            ),
            // No valid window: never.
            (
                vec![window("", "02:00", 0, "")],
                "2027-01-04T03:00:00Z",
                None,
            ),
        ];
        for (windows, from, expected) in rows {
            assert_eq!(
                next_open(&windows, at(from)),
                expected.map(|(opens, closes)| (at(opens), at(closes))),
                "{windows:?} from {from}"
            );
        }
    }

    #[test]
    fn check_names_the_field_and_what_would_do() {
        let days = "write mon, tue, wed, thu, fri, sat or sun";
        let start = "write HH:MM, such as 02:00";
        // (window, error)
        let rows = [
            (window("", "02:00", 1, ""), None),
            (window("sat,sun", "23:59", 30 * HOUR, "Europe/Paris"), None),
            (window("Monday,TUE", "0:00", HOUR, "UTC"), None),
            (window("", "2:30", HOUR, "america/new_york"), None),
            (
                window("sat,funday", "02:00", HOUR, ""),
                Some(format!(r#"days: "funday" is not a day: {days}"#)),
            ),
            (
                window("", "25:00", HOUR, ""),
                Some(format!(r#"start: "25:00" is not a time of day: {start}"#)),
            ),
            (
                window("", "02:60", HOUR, ""),
                Some(format!(r#"start: "02:60" is not a time of day: {start}"#)),
            ),
            (
                window("", "0200", HOUR, ""),
                Some(format!(r#"start: "0200" is not a time of day: {start}"#)),
            ),
            (
                window("", "2:0", HOUR, ""),
                Some(format!(r#"start: "2:0" is not a time of day: {start}"#)),
            ),
            (
                window("", "", HOUR, ""),
                Some(format!(r#"start: "" is not a time of day: {start}"#)),
            ),
            (
                window("", "02:00", 0, ""),
                Some("duration: must be at least 1 second".to_owned()),
            ),
            (
                window("", "02:00", HOUR, "Mars/Base"),
                Some(
                    r#"timeZone: "Mars/Base" is not a known time zone: write an IANA name, such as Europe/Paris"#
                        .to_owned(),
                ),
            ),
            // The first problem, in the order of the fields.
            (
                window("funday", "25:00", 0, "Mars/Base"),
                Some(format!(r#"days: "funday" is not a day: {days}"#)),
            ),
        ];
        for (window, expected) in rows {
            assert_eq!(check(&window).err(), expected, "{window:?}");
        }
    }

    #[test]
    fn describe_writes_days_start_duration_and_zone() {
        // (window, description)
        let rows = [
            (
                window("sat,sun", "02:00", 4 * HOUR, "Europe/Paris"),
                "sat, sun 02:00 for 4h Europe/Paris",
            ),
            // Every day, UTC by default.
            (
                window("", "02:00", 4 * HOUR, ""),
                "every day 02:00 for 4h UTC",
            ),
            // Days short, in week order, once; the start as HH:MM; the zone by its name.
            (
                window("Sunday,SAT,mon,sat", "2:30", 90 * 60, "europe/paris"),
                "mon, sat, sun 02:30 for 1h30m Europe/Paris",
            ),
            (
                window("sat", "22:00", 30 * HOUR, "UTC"),
                "sat 22:00 for 30h UTC",
            ),
            (window("fri", "23:00", 45, ""), "fri 23:00 for 45s UTC"),
            (
                window("fri", "23:00", HOUR + 5, ""),
                "fri 23:00 for 1h5s UTC",
            ),
            // What does not parse is written as it is.
            (
                window("funday,mon", "25:00", 0, "Mars/Base"),
                "mon, funday 25:00 for 0s Mars/Base",
            ),
        ];
        for (window, expected) in rows {
            assert_eq!(describe(&window), expected, "{window:?}");
        }
    }
}
